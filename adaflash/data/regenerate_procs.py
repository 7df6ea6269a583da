"""`data regenerate --procs N`: N copies of the command side by side, one shard each, then one output.

Why processes: one regenerating process keeps a CPU core busy launching small kernels and leaves a
GPU mostly idle, so several processes answer several times as many prompts an hour on one GPU
(docs/benchmarks.md, "Answers an hour"). No torch here: the parent only starts, watches and merges.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.data.io import open_text, write_jsonl_atomic


class ShardError(RuntimeError):
    pass


@dataclass
class Shard:
    index: int
    count: int
    out: Path  # this shard's own OUT; its .partial, .log and .summary.json sit beside it

    @property
    def partial(self) -> Path:
        return Path(str(self.out) + ".partial")

    @property
    def log(self) -> Path:
        return Path(str(self.out) + ".log")

    @property
    def summary(self) -> Path:
        """Where the process's --json summary goes: a file, since a pipe read only at the end would fill up
        (64 KB) with a long list of skipped prompts and block the process forever."""
        return Path(str(self.out) + ".summary.json")

    @property
    def spec(self) -> str:
        return f"{self.index}/{self.count}"


def shards_of(out_file: str | Path, count: int) -> list[Shard]:
    """answers.jsonl.gz -> answers.shard-0-of-8.jsonl.gz, ...: the suffixes stay, so gzip stays gzip."""
    out = Path(out_file)
    name = out.name
    stem, dot, rest = name.partition(".")
    return [Shard(i, count, out.with_name(f"{stem}.shard-{i}-of-{count}{dot}{rest}")) for i in range(count)]


def rows_done(shard: Shard) -> int:
    """Rows a running shard has finished so far (its partial file grows one line per answer)."""
    try:
        with shard.partial.open("rb") as handle:
            return sum(1 for _ in handle)
    except FileNotFoundError:
        return 0


def finished(shard: Shard) -> bool:
    """A shard whose process wrote its OUT with nothing left over (a run that failed elsewhere kept it)."""
    return shard.out.is_file() and not shard.partial.exists()


def count_rows(path: Path) -> int:
    with open_text(path) as handle:
        return sum(1 for line in handle if line.strip())


def run_shards(argv: Callable[[Shard], list[str]], shards: list[Shard], *, resume: bool = False,
               on_poll: Callable[[int], None] = lambda done: None) -> list[dict[str, Any]]:
    """Run one process per shard (`argv(shard)`, its --json summary on stdout) and wait for all.

    A failed shard stops the others: their partial files, and the OUT of those that finished, stay;
    with `resume` a finished shard is not run again and the others continue from their partial files.
    """
    kept = {s.index: {"rows": count_rows(s.out), "resumed_rows": count_rows(s.out)}
            for s in shards if resume and finished(s)}
    summaries = run_processes(argv, [s for s in shards if s.index not in kept], on_poll)
    return [kept.get(s.index) or summaries.pop(0) for s in shards]


def run_processes(argv: Callable[[Shard], list[str]], shards: list[Shard],
                  on_poll: Callable[[int], None]) -> list[dict[str, Any]]:
    """One process group per shard (through `procs.spawn`: it dies with us and is stopped as a whole)."""
    groups = []
    try:
        for shard in shards:
            shard.out.parent.mkdir(parents=True, exist_ok=True)
            with shard.log.open("wb") as log, shard.summary.open("wb") as summary:
                groups.append(procs.spawn(argv(shard), log=log, stdout=summary))
        while any(g.alive() for g in groups):
            failed = next(((s, g) for s, g in zip(shards, groups) if g.returncode not in (None, 0)), None)
            if failed is not None:
                raise ShardError(shard_failure(*failed))
            on_poll(sum(rows_done(s) for s in shards))
            time.sleep(1.0)
        failed = next(((s, g) for s, g in zip(shards, groups) if g.returncode != 0), None)
        if failed is not None:
            raise ShardError(shard_failure(*failed))
        return [json.loads(s.summary.read_text(encoding="utf-8")) for s in shards]
    finally:
        _stop_all(groups)


def _stop_all(groups: list[procs.ProcessGroup], grace: float = 30.0) -> None:
    """SIGTERM every shard still running at once, then wait for each (SIGKILL after `grace`)."""
    for group in groups:
        if group.alive():
            group.ask_stop()
    for group in groups:
        group.stop(grace=grace)


def shard_failure(shard: Shard, group: procs.ProcessGroup) -> str:
    code = group.returncode
    tail = shard.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-8:]
    said = "\n  ".join(tail) or "(nothing on stderr)"
    return (f"shard {shard.spec} failed (exit {code}); its log {shard.log}:\n  {said}\n"
            "the shards' partial files stay: run again with --resume")


def merge(shards: list[Shard], out_file: str | Path) -> int:
    """Every shard's rows into OUT (atomically), then the shards' own files go. Returns the rows."""
    rows: list[dict[str, Any]] = []
    for shard in shards:
        with open_text(shard.out) as handle:
            rows.extend(json.loads(line) for line in handle if line.strip())
    write_jsonl_atomic(out_file, rows)
    for shard in shards:
        shard.out.unlink()
        shard.log.unlink(missing_ok=True)
        shard.summary.unlink(missing_ok=True)
    return len(rows)


def combined(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The shards' summaries as one: counts add up, and so do rates (the shards ran at the same time)."""
    added = ("rows", "new_rows", "resumed_rows", "unfinished", "skipped", "completion_tokens",
             "output_throughput", "answers_per_hour")
    out: dict[str, Any] = {key: sum(s.get(key) or 0 for s in summaries) for key in added}
    out["duration"] = max((s.get("duration") or 0.0) for s in summaries)
    drafted = [(s.get("accept_length") or 0.0, s.get("completion_tokens") or 0) for s in summaries]
    tokens = sum(t for _, t in drafted)
    out["accept_length"] = sum(a * t for a, t in drafted) / tokens if tokens else 0.0
    out["shard_runs"] = [s.get("run_id") for s in summaries]
    out["skipped_reasons"] = {rid: why for s in summaries for rid, why in (s.get("skipped_reasons") or {}).items()}
    return out


def child_command() -> list[str]:
    """This Python running the CLI: a child needs no `adaflash` script on PATH."""
    return [sys.executable, "-m", "adaflash.cli.main"]
