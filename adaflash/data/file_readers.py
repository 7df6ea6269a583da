"""Per-format readers: a local JSONL, JSON or Parquet file (optionally gzipped) as `(where, raw row)` pairs.

`where` is `file:line` or `file[index]`, so every skipped row and every error points at its place.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from adaflash.data.errors import DatasetError
from adaflash.data.json_array import JsonArrayReader


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def format_of(path: Path) -> str:
    """jsonl, json or parquet by the file name; an unsupported type is an error (checked before reading)."""
    name = path.name.lower()
    for suffix in (".jsonl", ".ndjson", ".json", ".parquet"):
        if name.endswith(suffix) or name.endswith(suffix + ".gz"):
            return "jsonl" if suffix == ".ndjson" else suffix[1:]
    raise DatasetError(f"{path}: unsupported file type; expected .jsonl, .json or .parquet (optionally .gz)")


def iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, value) per non-blank line; a line that is not JSON is an error naming file:line."""
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno}); "
                                       "expected one JSON object per line") from None
                yield f"{path}:{number}", value
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DatasetError(f"{path}: not a text JSONL file ({err})") from None


def iter_json(path: Path, on_truncated: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    """A .json file: an array of objects (decoded element by element), or {"data"|"rows": [...]}.

    A cut-off array is reported to `on_truncated` when given (a source known to be truncated),
    otherwise it is an error like any other invalid JSON.
    """
    try:
        with _open_text(path) as handle:
            head = handle.read(4096)
            stripped = head.lstrip()
            handle.seek(0)
            if stripped.startswith("["):
                yield from _iter_json_array(handle, path, on_truncated)
                return
            try:
                value = json.load(handle)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DatasetError(f"{path}: not a text JSON file ({err})") from None
    for index, item in enumerate(_row_list(value, path)):
        yield f"{path}[{index}]", item


def _iter_json_array(handle: IO[str], path: Path,
                     on_truncated: Callable[[str], None] | None) -> Iterator[tuple[str, Any]]:
    """The elements of a top-level array, streamed; a cut at the end goes to `on_truncated` or fails."""
    reader = JsonArrayReader(handle, path)
    yield from reader
    if reader.truncated:
        where = f"{path}:{reader.truncated_line}"
        if on_truncated is None:
            raise DatasetError(f"{where}: the JSON array is cut off (a truncated file?)")
        on_truncated(where)


def _row_list(value: Any, path: Path) -> list[Any]:
    """The rows of a whole JSON document: the array itself, or the list under data/rows/examples/instances."""
    if isinstance(value, dict):
        for key in ("data", "rows", "examples", "instances"):
            if isinstance(value.get(key), list):
                value = value[key]
                break
    if not isinstance(value, list):
        raise DatasetError(f"{path}: expected a JSON array of objects (or an object with a 'data' list)")
    return value


def iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    """Parquet through pyarrow (a dependency of `datasets`), in record batches."""
    from adaflash.extras import require

    pq = require("pyarrow.parquet", "data")  # `datasets` brings pyarrow
    try:
        reader = pq.ParquetFile(str(path))
    except Exception as err:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise DatasetError(f"{path}: not a Parquet file ({err})") from None
    index = 0
    for batch in reader.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path}[{index}]", row
            index += 1


def iter_file(path: Path, on_truncated: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    """Rows of a file in whichever supported format its name says."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    kind = format_of(path)
    if kind == "jsonl":
        return iter_jsonl(path)
    if kind == "json":
        return iter_json(path, on_truncated)
    return iter_parquet(path)
