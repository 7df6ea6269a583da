"""How far a recipe run is: which step of how many, each step's own progress, elapsed time.

Read from the run log and the job logs only, so it works the same for a run supervised in this
process, a detached one and one followed from another terminal. A step's own progress comes from,
in order: the recipe's `progress = {total, metric}` (the newest step, or value, of that metric in
the runs the job records, e.g. the training step), else the newest step of any metric it records,
else the last line of its log (progress bars that rewrite their line with a carriage return, as
rich and tqdm do, count as one line). How long the same job took the last time it finished (in
an earlier run of the same recipe) gives an estimate when the job reports nothing.

Plain text only here (the CLI renders it with rich); no torch.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.supervisor import clean_log_text

LOG_TAIL_BYTES = 8192
_FRACTION = re.compile(r"(?<![\d.])(\d+)\s*/\s*(\d+)(?![\d.])")


def format_seconds(seconds: float | None) -> str:
    """1:05, 12:40, 1:02:03."""
    if seconds is None:
        return ""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def last_log_line(path: str | os.PathLike | None, max_bytes: int = LOG_TAIL_BYTES) -> str | None:
    """The last non-empty line of a log as a terminal would show it, leaving out adaflash's own headers."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            data = handle.read()
    except OSError:
        return None
    for line in reversed(clean_log_text(data.decode(errors="replace")).split("\n")):
        line = " ".join(line.split())  # a bar without colours leaves runs of blanks
        if line and not line.startswith("=== adaflash:"):
            return line
    return None


@dataclass
class StepProgress:
    """One job of a recipe run as the progress display shows it."""

    index: int  # 1-based position in the recipe's start order
    name: str
    status: str
    description: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    done: float | None = None  # the job's own progress: done of total (total may be unknown)
    total: float | None = None
    metric: str | None = None  # the metric the progress comes from, and its newest value
    value: float | None = None
    log_line: str | None = None
    from_log: bool = False  # done/total were read from the log line (a progress bar)
    count: bool = False  # done counts reports (benchmark cells): the log line says which one runs
    previous: float | None = None  # seconds it took the last time it finished
    rate: float | None = None  # progress per second, measured between its first and newest report
    reported_at: float | None = None  # when the newest report came
    note: str | None = None
    log_path: str | None = None

    @property
    def elapsed(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    @property
    def fraction(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    @property
    def remaining(self) -> float | None:
        """Seconds left: from its own progress when it reports some, else from the last time it ran."""
        elapsed = self.elapsed
        if elapsed is None:
            return None
        if self.rate and self.total and self.done is not None:
            since = time.time() - self.reported_at if self.reported_at else 0.0
            return max(0.0, (self.total - self.done) / self.rate - since)
        fraction = self.fraction
        if fraction and fraction >= 0.1:  # earlier, one slow start skews it
            return elapsed * (1 - fraction) / fraction
        if self.previous is not None:
            return max(0.0, self.previous - elapsed)
        return None

    def detail(self) -> str:
        """What the job itself reports: `23/60 (38%) · loss 4.1`, `step 12`, or its log's last line."""
        if self.log_line and (self.from_log or self.done is None):
            return self.log_line  # the job's own words (a progress bar's last state included)
        parts = []
        if self.done is not None:
            if self.total:
                parts.append(f"{_number(self.done)}/{_number(self.total)} ({self.fraction:.0%})")
            else:
                parts.append(f"step {_number(self.done)}")
            if self.metric and self.value is not None and self.value != self.done:
                parts.append(f"{self.metric} {_number(self.value)}")
        if self.count and self.log_line:
            parts.append(self.log_line)
        return " · ".join(parts)

    def timing(self) -> str:
        """`1:05 elapsed, ~1:35 left` / `1:05, last run 2:40`."""
        if self.status == "cached":
            return "reused"
        elapsed = self.elapsed
        if elapsed is None:
            return f"last run {format_seconds(self.previous)}" if self.previous is not None else ""
        text = format_seconds(elapsed)
        if self.status in ("starting", "running", "ready"):
            remaining = self.remaining
            if remaining is not None and self.fraction is not None:
                text += f", ~{format_seconds(remaining)} left"
            elif self.previous is not None:
                text += f" (last run {format_seconds(self.previous)})"
        return text


@dataclass
class RunProgress:
    """A recipe run, step by step."""

    run: dict[str, Any]
    steps: list[StepProgress] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.steps)

    @property
    def active(self) -> list[StepProgress]:
        return [s for s in self.steps if s.status in ("starting", "running", "ready", "restarting")]

    @property
    def completed(self) -> int:
        return sum(s.status in ("finished", "cached") for s in self.steps)

    @property
    def elapsed(self) -> float:
        start = self.run.get("created_at") or time.time()
        return (self.run.get("ended_at") or time.time()) - start

    def line(self) -> str:
        """One plain line: what is happening now and how far the run is."""
        stamp = time.strftime("%H:%M:%S")
        tasks_active = [s for s in self.active if s.status != "ready"] or self.active
        if tasks_active:
            now = " | ".join(
                f"step {s.index}/{self.total} {s.name}"
                + (f": {s.detail()}" if s.detail() else "")
                + (f" · {s.timing()}" if s.timing() else "")
                for s in tasks_active)
        else:
            now = f"{self.completed}/{self.total} steps done"
        return f"[{stamp}] {now} · run {format_seconds(self.elapsed)}"


def previous_durations(runlog: Any, recipe_name: str | None, exclude: str | None = None,
                       limit: int = 20) -> dict[str, float]:
    """How long each job took the last time it finished, over earlier runs of the same recipe."""
    out: dict[str, float] = {}
    if not recipe_name:
        return out
    for run in runlog.list_runs(kind="recipe", limit=limit * 5):
        if run["id"] == exclude or run.get("name") != recipe_name:
            continue
        for job in runlog.jobs(run["id"]):
            if job["name"] in out or job["status"] != "finished":
                continue
            if job.get("started_at") and job.get("ended_at"):
                out[job["name"]] = job["ended_at"] - job["started_at"]
        limit -= 1
        if limit <= 0:
            break
    return out


def _metric_progress(runlog: Any, run_ids: list[str], metric: str | None,
                     count: bool = False) -> tuple[float | None, float | None, float | None, float | None]:
    """(done, value, rate, reported_at): the newest step (else value) of `metric`, how many times it was
    reported (`count`), or the highest step of any metric; rate = progress per second between the first
    and the newest report (start-up time left out); reported_at = the newest report's time."""
    if not run_ids:
        return None, None, None, None
    marks = ", ".join("?" * len(run_ids))
    if metric and count:
        rows = runlog.db.execute(
            f"SELECT COUNT(*), MIN(time), MAX(time) FROM metrics WHERE run_id IN ({marks}) AND name = ?",
            [*run_ids, metric]).fetchall()
        done, t0, t1 = rows[0] if rows else (0, None, None)
        if not done:
            return None, None, None, None
        rate = (done - 1) / (t1 - t0) if done > 1 and t1 > t0 else None
        return float(done), None, rate, t1
    if metric:
        rows = runlog.db.execute(
            f"SELECT COALESCE(step, value), value, time FROM metrics WHERE run_id IN ({marks}) AND name = ? "
            f"AND id IN ((SELECT MIN(id) FROM metrics WHERE run_id IN ({marks}) AND name = ?), "
            f"(SELECT MAX(id) FROM metrics WHERE run_id IN ({marks}) AND name = ?)) ORDER BY id",
            [*run_ids, metric, *run_ids, metric, *run_ids, metric]).fetchall()
    else:
        rows = runlog.db.execute(
            f"SELECT step, NULL, time FROM metrics WHERE run_id IN ({marks}) AND step IS NOT NULL "
            f"AND id IN ((SELECT MIN(id) FROM metrics WHERE run_id IN ({marks}) AND step IS NOT NULL), "
            f"(SELECT MAX(id) FROM metrics WHERE run_id IN ({marks}) AND step IS NOT NULL)) ORDER BY id",
            [*run_ids, *run_ids, *run_ids]).fetchall()
    if not rows or rows[-1][0] is None:
        return None, None, None, None
    (first, _, t0), (done, value, t1) = rows[0], rows[-1]
    rate = (done - first) / (t1 - t0) if first is not None and t1 > t0 and done > first else None
    return float(done), value, rate, t1


def run_progress(runlog: Any, view: Any, *, previous: Mapping[str, float] | None = None,
                 order: Iterable[str] | None = None) -> RunProgress:
    """The steps of a recipe run (a jobs.watch.RunView) with each one's progress."""
    config = view.run.get("config") if isinstance(view.run.get("config"), dict) else {}
    specs: dict[str, Any] = config.get("jobs") or {}
    rows = {j["name"]: j for j in view.jobs}
    names = list(order) if order is not None else list(rows) or list(specs)
    children: dict[str, list[str]] = {}
    for child in view.child_runs:
        children.setdefault(child["job"], []).append(child["id"])
    previous = previous or {}
    steps = []
    for index, name in enumerate(names, start=1):
        row = rows.get(name, {})
        spec = specs.get(name) or {}
        status = row.get("status") or "pending"
        step = StepProgress(
            index=index, name=name, status=status, description=spec.get("description"),
            started_at=row.get("started_at") if status != "cached" else None,
            ended_at=row.get("ended_at") if status != "cached" else None,
            total=spec.get("progress_total"), metric=spec.get("progress_metric"),
            previous=previous.get(name), log_path=row.get("log_path"),
            note=(row.get("message") or "").splitlines()[0] if row.get("message") else None,
        )
        if status in ("starting", "running", "ready", "restarting"):
            step.count = bool(spec.get("progress_count"))
            step.done, step.value, step.rate, step.reported_at = _metric_progress(
                runlog, children.get(name, []), step.metric, step.count)
            if step.done is None or step.count:
                step.log_line = last_log_line(step.log_path)
            if step.done is None:
                found = _FRACTION.findall(step.log_line or "")
                if found and step.total is None:
                    done, total = map(float, found[-1])
                    if 0 <= done <= total and total > 0:
                        step.done, step.total, step.from_log = done, total, True
            if step.log_line and len(step.log_line) > 100:
                step.log_line = step.log_line[:97] + "..."
        elif status == "finished" and step.total:
            step.done = step.total
        steps.append(step)
    return RunProgress(run=view.run, steps=steps)


__all__ = ["RunProgress", "StepProgress", "format_seconds", "last_log_line", "previous_durations", "run_progress"]
