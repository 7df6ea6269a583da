"""The swap buffer: an append-only JSONL of trajectories on a (possibly shared) filesystem path.

Why a file: inference and training workers may run on different machines that share a path.
Each line carries its sequence number `seq`; the writer fsyncs after every batch and, on start,
cuts a torn last line left by a killed writer. Readers never see a partial line (they stop at
the last newline). What a trainer has consumed is recorded with the weights it produced (see
weights.py), so a restart resumes exactly after the last published sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from adaflash.files import write_json_atomic

BUFFER_FILE = "trajectories.jsonl"
DONE_FILE = "producer_done.json"
STOP_FILE = "STOP"


class SwapBuffer:
    """Append-only rows with consecutive `seq`, read back by position.

    A run appends tens of thousands of rows; each process indexes the file's complete lines
    once (the byte offset where each starts) and afterwards reads only what was appended since,
    so counting and reading stay cheap however long the run, where rescanning the whole file at
    every flush and every training step would grow with the run.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / BUFFER_FILE
        self._starts: list[int] = [0]  # byte offset of each indexed line, then the end of the last one

    # -- writer side -------------------------------------------------------------------------
    def repair(self) -> int:
        """Cut a torn final line (a writer killed mid-append); returns the number of complete rows."""
        count = self.count()
        if self.path.exists() and self.path.stat().st_size != self._starts[-1]:
            with self.path.open("r+b") as handle:
                handle.truncate(self._starts[-1])
        return count

    def append(self, rows: list[dict[str, Any]]) -> int:
        """Append rows with consecutive `seq` numbers; returns the new count."""
        start = self.count()
        with self.path.open("a", encoding="utf-8") as handle:
            for offset, row in enumerate(rows):
                handle.write(json.dumps({"seq": start + offset, **row}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return start + len(rows)

    def mark_done(self) -> None:
        write_json_atomic(self.root / DONE_FILE, {"count": self.count()})

    def clear_done(self) -> None:
        (self.root / DONE_FILE).unlink(missing_ok=True)

    # -- reader side ---------------------------------------------------------------------------
    def count(self) -> int:
        """Complete rows (a torn last line is not one), indexing those appended since the last call."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if size < self._starts[-1]:  # cut, or replaced by a shorter file: index it again
            self._starts = [0]
        if size > self._starts[-1]:
            end = self._starts[-1]
            with self.path.open("rb") as handle:
                handle.seek(end)
                tail = handle.read(size - end)
            at = tail.find(b"\n")
            while at >= 0:
                self._starts.append(end + at + 1)
                at = tail.find(b"\n", at + 1)
        return len(self._starts) - 1

    def read(self, start: int, limit: int) -> list[dict[str, Any]]:
        """Rows with seq in [start, start + limit), in order (complete lines only)."""
        count = self.count()
        stop = min(count, start + max(limit, 0))
        if start >= stop:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self._starts[start])
            data = handle.read(self._starts[stop] - self._starts[start])
        out: list[dict[str, Any]] = []
        for index, line in enumerate(data.splitlines(), start):
            row = json.loads(line)
            if row.get("seq") != index:
                raise ValueError(f"{self.path}: line {index + 1} has seq {row.get('seq')}, expected {index}")
            out.append(row)
        return out

    def producer_done(self) -> int | None:
        path = self.root / DONE_FILE
        if not path.exists():
            return None
        return int(json.loads(path.read_text())["count"])

    # -- stop requests -------------------------------------------------------------------------------
    def request_stop(self) -> None:
        (self.root / STOP_FILE).write_text("stop\n")

    def stop_requested(self) -> bool:
        return (self.root / STOP_FILE).exists()

    def clear_stop(self) -> None:
        (self.root / STOP_FILE).unlink(missing_ok=True)
