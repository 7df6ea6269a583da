"""A resolved dataset source, and how its raw rows are read: per-split files, one file, or a hub dataset.

Built-ins, local files and hub ids all end up as a `DatasetSource`, so preparation has one path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaflash.data.column_map import normalize_row
from adaflash.data.conversations import Row
from adaflash.data.errors import DatasetError
from adaflash.data.file_readers import iter_file

if TYPE_CHECKING:
    from adaflash.data.prepare import PrepareStats

SPLITS = ("train", "test")
DEFAULT_TEST_FRACTION = 0.1

Normalizer = Callable[[Any, int, str], Row]  # (raw, index within its split, split name) -> row
RawRows = Iterable[tuple[str, Any]]


@dataclass
class DatasetSource:
    """A resolved dataset: where it comes from and how its rows are read and normalized.

    `read()` returns either {"train": rows, "test": rows} (an official split, kept) or one
    stream that is split by hash.
    """

    name: str
    kind: str  # builtin | file | hub
    location: str
    read: Callable[[PrepareStats], dict[str, RawRows] | RawRows]
    normalize: Normalizer
    default_test_fraction: float = DEFAULT_TEST_FRACTION
    official_split: bool = False


def split_files(folder: Path) -> dict[str, Path]:
    """train/test files of a folder (any supported format), when it has them."""
    if not folder.is_dir():
        return {}
    files: dict[str, Path] = {}
    for split in SPLITS:
        for suffix in (".jsonl", ".jsonl.gz", ".json", ".parquet"):
            path = folder / f"{split}{suffix}"
            if path.is_file():
                files[split] = path
                break
    return files


def column_normalizer(name: str, column_map: dict[str, str]) -> Normalizer:
    """The normalizer of sources without their own: by the column map or common column names."""

    def normalize(raw: Any, index: int, split: str) -> Row:
        return normalize_row(raw, column_map, name)

    return normalize


def read_split_files(files: dict[str, Path]) -> Callable[[PrepareStats], dict[str, RawRows]]:
    """Read each split from its own file, keeping the source's split."""

    def read(stats: PrepareStats) -> dict[str, RawRows]:
        return {split: iter_file(path) for split, path in files.items()}

    return read


def read_one_file(path: Path, tolerate_truncation: bool = False) -> Callable[[PrepareStats], RawRows]:
    """Read one file to be split by hash; a known-truncated file counts its cut instead of failing."""

    def read(stats: PrepareStats) -> RawRows:
        return iter_file(path, stats.truncate if tolerate_truncation else None)

    return read


def hub_source(name: str, hub_id: str, config: str | None, column_map: dict[str, str],
               hint: str = "") -> DatasetSource:
    """A hub dataset through `datasets`, loaded only when read (it needs the network)."""

    def read(stats: PrepareStats) -> dict[str, RawRows] | RawRows:
        from adaflash.extras import require

        load_dataset = require("datasets", "data").load_dataset
        try:
            loaded = load_dataset(hub_id, config) if config else load_dataset(hub_id)
        except Exception as err:  # offline, unknown id, bad config: all the same to the user
            prefix = f"{hint}; " if hint else ""
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise DatasetError(f"{prefix}could not load {hub_id!r} from the Hugging Face hub: "
                               f"{type(err).__name__}: {first_line}") from None
        splits = dict(loaded) if hasattr(loaded, "keys") else {"train": loaded}

        def rows(split: str) -> RawRows:
            return ((f"{hub_id}[{split}][{i}]", row) for i, row in enumerate(splits[split]))

        if "train" in splits and "test" in splits:
            return {"train": rows("train"), "test": rows("test")}
        return (item for split in splits for item in rows(split))

    return DatasetSource(name, "hub", hub_id + (f":{config}" if config else ""), read,
                         column_normalizer(name, column_map))
