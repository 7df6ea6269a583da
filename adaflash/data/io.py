"""Atomic JSONL writing: a reader (a trainer, a benchmark) never sees a half-written file."""

from __future__ import annotations

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
        self.handle: IO[str] = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0

    def write(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.count += 1

    def commit(self) -> Path:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        give_usual_modes(self.tmp)
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        if not self.handle.closed:
            self.handle.close()
        self.tmp.unlink(missing_ok=True)


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
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{where}: not valid JSON ({err.msg})") from None
