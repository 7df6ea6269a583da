"""What `adaflash data prepare DATASET [--source ...]` names: a built-in, a local file or folder, or a hub id.

Offline first: a built-in name wins, then an existing path; a hub id is tried (through `datasets`)
only when the name is neither.
"""

from __future__ import annotations

import re
from pathlib import Path

from adaflash.data.builtin_datasets import BUILTIN_DATASETS, builtin_source
from adaflash.data.errors import DatasetError
from adaflash.data.file_readers import format_of
from adaflash.data.sources import (
    DatasetSource,
    column_normalizer,
    hub_source,
    read_one_file,
    read_split_files,
    split_files,
)

_FILE_SUFFIX = re.compile(r"\.(jsonl|ndjson|json|parquet)(\.gz)?$", re.I)


def resolve_dataset(dataset: str, source: str | None = None, *, column_map: dict[str, str] | None = None,
                    name: str | None = None, hub_config: str | None = None) -> DatasetSource:
    """What DATASET (and --source) name: a built-in, a local file or folder, or a hub id.

    Cheap: checks that the source exists without reading it, so the caller can fail early.
    """
    column_map = column_map or {}
    key = dataset.lower()
    if key in BUILTIN_DATASETS:
        src = _builtin(key, source, column_map, name)
    else:
        src = _local_or_hub(dataset, source, column_map, name, hub_config)
    if hub_config and src.kind != "hub":
        raise DatasetError(f"--hub-config applies to hub datasets only; {dataset!r} is read from "
                           f"{src.location}")
    return src


def _builtin(key: str, source: str | None, column_map: dict[str, str], name: str | None) -> DatasetSource:
    if column_map:
        raise DatasetError(f"--column-map does not apply to the built-in dataset {key!r}")
    src = builtin_source(key, source)
    src.name = name or key
    return src


def _local_or_hub(dataset: str, source: str | None, column_map: dict[str, str], name: str | None,
                  hub_config: str | None) -> DatasetSource:
    """An existing folder or file (never mistaken for a hub id), else a hub id owner/name."""
    target = source if source is not None else dataset
    out_name = name or _name_of(dataset)
    path = Path(target).expanduser()
    if path.is_dir():
        return _folder_source(path, out_name, column_map)
    if path.is_file():
        format_of(path)
        normalize = column_normalizer(out_name, column_map)
        return DatasetSource(out_name, "file", str(path), read_one_file(path), normalize)
    if source is not None or _looks_like_path(target):
        raise DatasetError(f"{target}: no such file or folder")
    if "/" not in target:
        raise DatasetError(f"unknown dataset {dataset!r}: built-ins are {', '.join(BUILTIN_DATASETS)}; "
                           "otherwise give a local .jsonl/.json/.parquet file or a hub id owner/name")
    return hub_source(out_name, target, hub_config, column_map)


def _folder_source(path: Path, out_name: str, column_map: dict[str, str]) -> DatasetSource:
    """A folder of train.* and test.* files keeps that split; with only one of them it is split by hash."""
    files = split_files(path)
    if not files:
        raise DatasetError(f"{path}: a folder needs train.* and/or test.* files (.jsonl, .json or .parquet)")
    normalize = column_normalizer(out_name, column_map)
    if len(files) == 1:
        (only,) = files.values()
        return DatasetSource(out_name, "file", str(only), read_one_file(only), normalize)
    return DatasetSource(out_name, "file", str(path), read_split_files(files), normalize, official_split=True)


def _name_of(text: str) -> str:
    """A file-name-safe dataset name: 'owner/My Data' -> 'my-data'."""
    base = text.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".jsonl", ".ndjson", ".json", ".parquet"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.").lower()
    return safe or "dataset"


def _looks_like_path(text: str) -> bool:
    """A name that can only mean a file, so a missing one is never looked up on the hub."""
    return text.startswith((".", "/", "~")) or bool(_FILE_SUFFIX.search(text))
