"""Reading a run back from the run log: its jobs, metrics, events and the runs its jobs made.

This works the same for a run supervised in this process and for one detached into the
background (or on Slurm), which is why `adaflash run`, `runs attach` and the TUI all use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from adaflash.runlog import RunLog
from jobs.control import LIVE_RUN_STATUSES, supervisor_pid


@dataclass
class RunView:
    """A run as the run log shows it now (for attach, the TUI, `runs show`)."""

    run: dict[str, Any]
    jobs: list[dict[str, Any]]
    metrics: dict[str, float]  # the run's own, then "job:name" for runs its jobs created
    events: list[dict[str, Any]]  # events after the id asked for
    supervisor_alive: bool
    child_runs: list[dict[str, Any]] = field(default_factory=list)  # runs created by this run's jobs

    @property
    def status(self) -> str:
        return self.run["status"]

    @property
    def live(self) -> bool:
        return self.status in LIVE_RUN_STATUSES and self.supervisor_alive

    @property
    def orphaned(self) -> bool:
        """Recorded as live, but its supervisor is gone (crashed or killed)."""
        return self.status in LIVE_RUN_STATUSES and not self.supervisor_alive

    @property
    def last_event_id(self) -> int:
        return self.events[-1]["id"] if self.events else 0

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "jobs": self.jobs, "metrics": self.metrics, "events": self.events,
                "supervisor_alive": self.supervisor_alive, "live": self.live, "child_runs": self.child_runs}


def run_view(runlog: RunLog, run_id: str, *, events_after: int = 0) -> RunView:
    run = runlog.get_run(run_id)
    jobs = runlog.jobs(run["id"])
    children = runlog.child_runs(run, jobs)
    metrics = dict(runlog.last_metrics(run["id"]))
    for child in children:
        for name, value in runlog.last_metrics(child["id"]).items():
            metrics[f"{child['job']}:{name}"] = value
    return RunView(
        run=run, jobs=jobs, metrics=metrics, events=runlog.events_since(events_after, run_id=run["id"]),
        supervisor_alive=supervisor_pid(run) is not None, child_runs=children,
    )


def follow_run(
    runlog: RunLog, run_id: str, *, interval: float = 0.5, stop: threading.Event | None = None
) -> Iterator[RunView]:
    """Views of a run every `interval` (events incremental) until it ends or `stop` is set."""
    after = 0
    while True:
        view = run_view(runlog, run_id, events_after=after)
        after = max(after, view.last_event_id)
        yield view
        if not view.live or (stop is not None and stop.is_set()):
            return
        if stop is not None:
            if stop.wait(interval):
                return
        else:
            time.sleep(interval)
