"""Atomic JSONL writing: a reader (a trainer, a benchmark) never sees a half-written file.

A path ending in `.gz` is written and read gzip-compressed (a regenerated corpus is a quarter of
its size that way), everywhere a JSONL file is taken.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from adaflash.files import give_usual_modes


class JsonlWriter:
    """Writes rows to a temp file beside the target; `commit()` moves it into place."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.tmp = Path(tmp)
        raw = os.fdopen(fd, "wb")
        self._raw = raw
        # closed by commit() or abort(), whichever ends the writer
        self.handle: IO[str] = (gzip.open(raw, "wt", encoding="utf-8", compresslevel=6)  # noqa: SIM115
                                if is_gzip(self.path) else open(fd, "w", encoding="utf-8", closefd=False))  # noqa: SIM115
        self.count = 0

    def write(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.count += 1

    def commit(self) -> Path:
        self.handle.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        give_usual_modes(self.tmp)
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        for handle in (self.handle, self._raw):
            if not handle.closed:
                handle.close()
        self.tmp.unlink(missing_ok=True)


def is_gzip(path: str | os.PathLike) -> bool:
    return str(path).endswith(".gz")


def open_text(path: str | os.PathLike) -> IO[str]:
    """A JSONL file for reading, gzip-compressed when its name ends in `.gz`."""
    return gzip.open(path, "rt", encoding="utf-8") if is_gzip(path) else open(path, encoding="utf-8")


@contextmanager
def atomic_jsonl(*paths: str | os.PathLike) -> Iterator[list[JsonlWriter]]:
    """Writers for several files that all appear together at the end, or none on error."""
    with ExitStack() as stack:
        writers: list[JsonlWriter] = []
        for path in paths:
            writer = JsonlWriter(path)
            writers.append(writer)
            stack.callback(writer.abort)
        yield writers
        for writer in writers:
            writer.commit()


def write_jsonl_atomic(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    with atomic_jsonl(path) as (writer,):
        for row in rows:
            writer.write(row)
    return Path(path)


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError) -> Iterator[tuple[str, Any]]:
    """(`file:line`, object) for each non-blank line; a line that is not JSON raises `error` naming it."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such file")
    with open_text(path) as handle:
        for number, line in enumerate(_lines(handle, path, error), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{where}: not valid JSON ({err.msg})") from None


def _lines(handle: IO[str], path: Path, error: type[Exception]) -> Iterator[str]:
    """The file's lines; a gzip file cut short or damaged raises `error` naming it."""
    try:
        yield from handle
    except (EOFError, OSError) as err:
        raise error(f"{path}: damaged or cut-short gzip file ({err})") from None
