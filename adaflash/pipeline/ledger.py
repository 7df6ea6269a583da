"""The consumption ledger: which buffer rows each training step took, rank by rank.

Why a file beside the buffer and not rows in the run log: the integrity check of a run compares
the set of samples the trainers consumed with what the buffer holds, so both must live on the
same (possibly shared) path, and a step's record is a short list of sequence numbers that the
run log's numeric metrics cannot hold. One JSON line per training step (not per token), written
by rank 0 with what every rank reports after the step, fsynced like the buffer.

A restarted trainer resumes from the last *published* version; steps it took after that version
are learned again, so `rewind(consumed)` drops their entries and the ledger keeps describing
exactly what the published weights learned from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LEDGER_FILE = "consumed.jsonl"


class ConsumeLedger:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / LEDGER_FILE

    def append(self, entry: dict[str, Any]) -> None:
        """One step: {"step", "from", "to", "ranks": [[seq, ...] per rank], "unusable": [seq, ...], "time"}."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> list[dict[str, Any]]:
        """Complete lines only (a trainer killed mid-append leaves a torn last line, ignored)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def rewind(self, consumed: int) -> int:
        """Keep the steps that ended at or before `consumed`; returns how many entries were dropped."""
        if not self.path.exists():
            return 0
        raw = self.path.read_bytes()
        torn = bool(raw) and not raw.endswith(b"\n")
        entries = self.entries()
        kept = [e for e in entries if int(e["to"]) <= consumed]
        if len(kept) == len(entries) and not torn:
            return 0
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        return len(entries) - len(kept)
