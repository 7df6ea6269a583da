"""The two ways dataset preparation fails: a whole source stops it, a single bad row is only skipped."""

from __future__ import annotations


class DatasetError(ValueError):
    """A source that cannot be read as stated; the message names the file (and line)."""


class RowError(ValueError):
    """One row that cannot be normalized; it is skipped and counted under its reason."""
