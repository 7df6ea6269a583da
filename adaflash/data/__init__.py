"""Datasets: preparation into normalized rows, prompt files, regeneration by the target.

Preparation (`adaflash data prepare`), in the order a row goes through it:
resolve (DATASET -> a source) -> builtin_datasets / offline_copies (the named datasets and where their
offline copies are) -> sources (how raw rows are read) -> file_readers, json_array (JSONL/JSON/Parquet)
-> column_map, conversations (raw row -> normalized row) -> prepare (the train/test split, written
atomically). errors holds the two failures: a whole source, or one skipped row.
"""
