"""Datasets: preparation into normalized rows, prompt files, regeneration by the target."""
