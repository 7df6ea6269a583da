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

BUFFER_FILE = "trajectories.jsonl"
DONE_FILE = "producer_done.json"
STOP_FILE = "STOP"


def _complete_size(path: Path) -> int:
    """Byte length up to and including the last newline."""
    if not path.exists():
        return 0
    with path.open("rb") as handle:
        data = handle.read()
    return data.rfind(b"\n") + 1


class SwapBuffer:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / BUFFER_FILE

    # -- writer side -------------------------------------------------------------------------
    def repair(self) -> int:
        """Cut a torn final line (a writer killed mid-append); returns the number of complete rows."""
        size = _complete_size(self.path)
        if self.path.exists() and self.path.stat().st_size != size:
            with self.path.open("r+b") as handle:
                handle.truncate(size)
        return self.count()

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
        tmp = self.root / (DONE_FILE + ".tmp")
        tmp.write_text(json.dumps({"count": self.count()}))
        os.replace(tmp, self.root / DONE_FILE)

    def clear_done(self) -> None:
        (self.root / DONE_FILE).unlink(missing_ok=True)

    # -- reader side ---------------------------------------------------------------------------
    def count(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            data = handle.read(_complete_size(self.path))
        return data.count(b"\n")

    def read(self, start: int, limit: int) -> list[dict[str, Any]]:
        """Rows with seq in [start, start + limit), in order (complete lines only)."""
        out: list[dict[str, Any]] = []
        if not self.path.exists() or limit <= 0:
            return out
        complete = _complete_size(self.path)
        with self.path.open("rb") as handle:
            data = handle.read(complete)
        for index, line in enumerate(data.splitlines()):
            if index < start:
                continue
            if len(out) >= limit:
                break
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
