"""What the Monitor shows, folded incrementally from metric rows (a display model, no widgets).

Why incremental: the run log may hold millions of rows and keeps growing while workers write;
each refresh hands only the rows after the last id seen, and this model folds them into
bounded state (a few running numbers per series, the last points for the charts, and τ per
drafter version), so a refresh costs what is new, never what is old.

τ per drafter version has one definition, `adaflash pipeline status`'s (and the run log's view
`tau_per_version`): the mean over the requests each version finished, from the inference worker's
`served_*` rows, with the request count beside it. Runs from before those rows get the mean of the
flush windows, as `pipeline status` does, and say so.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tui.backend import LIVE_RUN_STATUSES

HISTORY = 600  # points kept per series for the charts
SPARK = "▁▂▃▄▅▆▇█"

# Chart families: (title, metric names on the left axis, names on the right axis). Generation speed (tens of
# tokens/s) and training speed (thousands) never share an axis: the smaller would lie flat on the floor.
CHARTS = (
    ("acceptance length τ", ("tau", "holdout_tau", "eval_tau", "block_accept_len", "avg_spec_accept_length", "accept_length"), ()),
    ("tok/s: generation ◂ · ▸ training", ("tokens_per_s", "gen_throughput", "output_throughput",
                                          "live_tokens_per_s"), ("train_tokens_per_s",)),
    ("training losses", ("loss", "loss_ce", "loss_rkl", "loss_fkl"), ()),
    ("buffer depth", ("buffer_depth", "queue_depth", "consumed"), ()),
)
TRAINING_JOBS = ("train", "training")  # jobs whose `tokens_per_s` is training speed (offline `adaflash train`)
VERSION_METRICS = ("tau", "tokens_per_s", "samples")
SERVED_METRICS = ("served_requests", "served_tau_sum", "served_tokens", "served_verify")  # the run log's
# Generation speed from the workers' once-a-second progress records (tokens so far): a point from the first
# seconds, where `tokens_per_s` waits for the first flush of finished answers (minutes on a CPU).
LIVE_TOKENS = "live_tokens_per_s"


@dataclass
class Series:
    """One metric of one source: running statistics and the last points."""

    name: str
    source: str = ""
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    last: float | None = None
    last_step: int | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (time, value)

    @property
    def label(self) -> str:
        return f"{self.source}:{self.name}" if self.source else self.name

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def add(self, t: float, value: float, step: int | None) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)
        self.last = value
        self.last_step = step
        self.points.append((t, value))


@dataclass
class VersionStats:
    version: int
    source: str = ""
    n: int = 0  # flush windows
    tau_sum: float = 0.0  # of the windows' τ
    tps_sum: float = 0.0
    tps_n: int = 0
    samples: float | None = None
    requests: int = 0  # finished by this version (served_requests)
    served_tau_sum: float = 0.0
    served_tokens: float = 0.0
    served_verify: float = 0.0

    @property
    def per_request(self) -> bool:
        """τ is the mean over requests (pipeline status's); else the mean of flush windows (older runs)."""
        return self.requests > 0

    @property
    def tau(self) -> float | None:
        if self.requests:
            return self.served_tau_sum / self.requests
        return self.tau_sum / self.n if self.n else None

    @property
    def tau_tokens(self) -> float | None:
        """Token-weighted τ (tokens / verify steps), as `pipeline status` shows beside it."""
        return self.served_tokens / self.served_verify if self.served_verify else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tps_sum / self.tps_n if self.tps_n else None


class MonitorModel:
    """Folds metric rows of one run (and of the runs its jobs created) into chartable state."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id
        self.cursors: dict[str, int] = {}
        self.sources: dict[str, str] = {}
        self.statuses: dict[str, str] = {}  # run id -> status at the last read
        self.series: dict[tuple[str, str], Series] = {}
        self.versions: dict[tuple[str, int], VersionStats] = {}
        self.start: float | None = None
        self.rows_seen = 0
        self.generation = 0  # bumped on every change, so views redraw only when something is new

    def reset(self, run_id: str | None) -> None:
        self.__init__(run_id)  # type: ignore[misc]

    def ingest(self, run_id: str, sources: dict[str, str], rows: dict[str, list[dict[str, Any]]],
               statuses: dict[str, str] | None = None) -> int:
        """Fold new rows; rows at or below a cursor (a late duplicate read) are skipped. Returns rows used."""
        if run_id != self.run_id:
            return 0
        self.sources.update(sources)
        if statuses and any(self.statuses.get(rid) != status for rid, status in statuses.items()):
            self.statuses.update(statuses)
            self.generation += 1  # an end changes what the progress line says
        used = 0
        for rid, batch in rows.items():
            cursor = self.cursors.get(rid, 0)
            fresh = [r for r in batch if r["id"] > cursor]
            if not fresh:
                continue
            source = self.sources.get(rid, "")
            self._fold(source, fresh)
            self.cursors[rid] = fresh[-1]["id"]
            used += len(fresh)
        if used:
            self.rows_seen += used
            self.generation += 1
        return used

    def _fold(self, source: str, rows: list[dict[str, Any]]) -> None:
        series = self.series
        # Rows of one step are written together; pair τ and throughput with that step's drafter version.
        version_of: dict[tuple[Any, Any], float] = {}
        for row in rows:
            if row["name"] == "drafter_version" and row["step"] is not None:
                version_of[(row["job"], row["step"])] = row["value"]
        for row in rows:
            name, value, t = row["name"], row["value"], row["time"]
            if value is None:
                continue
            if name == "tokens_per_s" and row.get("job") in TRAINING_JOBS:
                name = "train_tokens_per_s"
            if self.start is None or (t is not None and t < self.start):
                self.start = t
            if name in SERVED_METRICS:
                if row.get("version") is not None:
                    self._served(source, int(row["version"]), name, value)
                continue  # per-version sums, not a time series
            if name == "tokens_so_far":
                self._live_speed(source, t, value)
            key = (source, name)
            item = series.get(key)
            if item is None:
                item = series[key] = Series(name, source)
            item.add(t or 0.0, value, row["step"])
            if name in VERSION_METRICS:
                version = version_of.get((row["job"], row["step"]))
                if version is None:
                    last = series.get((source, "drafter_version"))
                    version = last.last if last is not None else None
                if version is not None:
                    self._version(source, int(version), name, value)

    def _live_speed(self, source: str, t: float | None, tokens: float) -> None:
        before = self.series.get((source, "tokens_so_far"))
        if before is None or not before.points or t is None:
            return
        t0, tokens0 = before.points[-1]
        if t > t0 and tokens >= tokens0:
            key = (source, LIVE_TOKENS)
            item = self.series.get(key) or self.series.setdefault(key, Series(LIVE_TOKENS, source))
            item.add(t, (tokens - tokens0) / (t - t0), None)

    def _served(self, source: str, version: int, name: str, value: float) -> None:
        stats = self.versions.get((source, version))
        if stats is None:
            stats = self.versions[(source, version)] = VersionStats(version, source)
        if name == "served_requests":
            stats.requests += int(value)
        else:
            attr = name.removeprefix("served_")
            setattr(stats, f"served_{attr}", getattr(stats, f"served_{attr}") + value)

    def _version(self, source: str, version: int, name: str, value: float) -> None:
        stats = self.versions.get((source, version))
        if stats is None:
            stats = self.versions[(source, version)] = VersionStats(version, source)
        if name == "tau":
            stats.n += 1
            stats.tau_sum += value
        elif name == "tokens_per_s":
            stats.tps_n += 1
            stats.tps_sum += value
        elif name == "samples":
            stats.samples = value if stats.samples is None else max(stats.samples, value)

    # -- views ----------------------------------------------------------------------------------
    def chart(self, names: Iterable[str]) -> list[tuple[str, list[float], list[float]]]:
        """(label, x seconds since the run's first metric, y) of each series named, in name order; a name
        also takes its per-tag series (`tau@code`, an adapting server's τ of requests tagged code)."""
        out = []
        start = self.start or 0.0
        for name in names:
            for (_source, metric), item in sorted(self.series.items()):
                if (metric == name or metric.startswith(name + "@")) and item.points:  # tau@code: τ of one tag
                    xs = [t - start for t, _ in item.points]
                    ys = [v for _, v in item.points]
                    out.append((self.label(item, metric), xs, ys))
        return out

    def ended(self, source: str | None = None) -> str | None:
        """The status of an ended run (of one source, or of the followed run), else None while it runs."""
        rids = [rid for rid, label in self.sources.items() if label == source] if source is not None else \
            [self.run_id]
        statuses = [self.statuses[rid] for rid in rids if rid in self.statuses]
        if not statuses or any(s in LIVE_RUN_STATUSES for s in statuses):
            return None
        return statuses[-1]

    def progress(self) -> str:
        """What is under way, from the workers' progress records: shown before any τ or loss exists. Once the
        run that recorded them ended, what it did in all (nothing is "in flight" any more)."""
        def last(name: str) -> Series | None:
            found = [s for (_, metric), s in self.series.items() if metric == name and s.last is not None]
            return max(found, key=lambda s: s.points[-1][0] if s.points else 0.0) if found else None

        def value(series: Series | None) -> float | None:
            return series.last if series is not None else None

        parts = []
        in_flight, tokens, answers = last("prompts_in_flight"), last("tokens_so_far"), last("answers_so_far")
        if in_flight is not None or tokens is not None:
            source = (in_flight or tokens).source  # type: ignore[union-attr]
            status = self.ended(source)
            done = f"{fmt_count(value(tokens))} tokens · {fmt_count(value(answers))} answers"
            parts.append(f"inference {status}: {done}" if status else
                         f"inference: {fmt_count(value(in_flight))} prompts in flight · {done}")
        step = last("training_step")
        if step is not None:
            status = self.ended(step.source)
            parts.append(f"training {status} at step {fmt_count(step.last)}" if status else
                         f"training: step {fmt_count(step.last)}")
        return " │ ".join(parts)

    def table(self) -> list[Series]:
        return sorted(self.series.values(), key=lambda s: (s.source, s.name))

    def label(self, item: Series | VersionStats, text: str) -> str:
        """`text` (a metric, a version) with its source only where several sources are shown."""
        sources = {source for source, _ in self.series} | {source for source, _ in self.versions}
        return f"{item.source}:{text}" if item.source and len(sources) > 1 else text

    def version_table(self) -> list[VersionStats]:
        return sorted(self.versions.values(), key=lambda v: (v.source, v.version))


def spark(values: Iterable[float], width: int = 16) -> str:
    """A one-line sparkline of the last `width` values (flat when they are all equal)."""
    data = list(values)[-width:]
    if not data:
        return ""
    low, high = min(data), max(data)
    if high - low < 1e-12:
        return SPARK[3] * len(data)
    scale = (len(SPARK) - 1) / (high - low)
    return "".join(SPARK[int((v - low) * scale)] for v in data)


def fmt_count(value: float | None) -> str:
    """A count with thousands separators; N/A when missing."""
    return "N/A" if value is None or not math.isfinite(value) else f"{int(value):,}"


def fmt(value: float | None, digits: int = 3) -> str:
    """Numbers for narrow cells: N/A for missing, short for large, never an exception."""
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "N/A"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.3g}"
    if float(value).is_integer():
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.{digits}g}"
