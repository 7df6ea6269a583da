"""Controlling a run from any process: who supervises it, asking it to act, stopping it.

The process supervising a run is recorded in runs.pid and, with its create time, in
`<run_dir>/supervisor.json`, so that a signal only ever reaches that very process (never a
reused pid). Per-job requests (stop, restart) and stop-run are files in `<run_dir>/control/`
that the supervisor takes at its next tick. `stop_run` works even when the supervisor is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.runlog import LIVE_RUN_STATUSES, RunLog
from jobs.supervisor import ACTIVE

SUPERVISOR_FILE = "supervisor.json"
CONTROL_DIR = "control"
CONTROL_ACTIONS = ("stop", "restart", "stop-run")


# -- who supervises a run ------------------------------------------------------------------------


def write_supervisor_file(run_dir: Path, run_id: str, pid: int | None = None) -> dict[str, Any]:
    """Record `pid` (default: this process) as the run's supervisor, atomically, with its create time."""
    pid = pid or os.getpid()
    info = {"run_id": run_id, "pid": pid, "pid_start_time": procs.start_time(pid),
            "host": os.uname().nodename}
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{SUPERVISOR_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, run_dir / SUPERVISOR_FILE)
    return info


def supervisor_pid(run: dict[str, Any]) -> int | None:
    """The live process supervising `run` (verified by create time or command line), else None.

    A recipe's supervisor writes its identity to the run folder; every run also records its process's
    create time in the run log, so a pipeline or training command counts as its own supervisor.
    """
    pid = run.get("pid")
    if not pid or not run.get("run_dir"):
        return None
    try:
        info = json.loads((Path(run["run_dir"]) / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("pid") == pid and procs.is_ours(pid, info.get("pid_start_time")):
        return pid
    if run.get("pid_start_time") is not None:  # recorded with the run (any command's run, pipelines too)
        return pid if procs.is_ours(pid, run["pid_start_time"]) else None
    if procs.start_time(pid) is None:
        return None
    with contextlib.suppress(Exception):
        import psutil

        if run["id"] in psutil.Process(pid).cmdline():
            return pid
    return None


# -- requests to the supervisor ------------------------------------------------------------------


def request_job_action(run_dir: str | os.PathLike, action: str, job: str | None = None) -> Path:
    """Ask the supervisor of a run (in any process) to stop/restart a job, or stop the run."""
    if action not in CONTROL_ACTIONS:
        raise ValueError(f"unknown action {action!r} (known: {', '.join(CONTROL_ACTIONS)})")
    if action != "stop-run" and not job:
        raise ValueError(f"action {action!r} needs a job name")
    folder = Path(run_dir) / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time():.6f}-{secrets.token_hex(3)}"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps({"action": action, "job": job}))
    final = folder / f"{name}.json"
    os.replace(tmp, final)
    return final


def take_control_requests(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The requests waiting for the supervisor, oldest first, each removed as taken ({} if unreadable)."""
    folder = run_dir / CONTROL_DIR
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json")):
        try:
            request = json.loads(path.read_text())
        except (OSError, ValueError):
            request = {}
        with contextlib.suppress(OSError):
            path.unlink()
        yield request


# -- stopping a run from anywhere ------------------------------------------------------------------


@dataclass
class StopResult:
    """What `stop_run` did: who stopped the run (`how`), and the jobs it had to stop itself."""

    run_id: str
    status: str
    how: str  # "supervisor" | "direct" | "scancel" | "already ended"
    stopped_jobs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stop_jobs_directly(runlog: RunLog, run_id: str, grace: float, why: str) -> list[str]:
    """Stop a run's live jobs from outside its supervisor, each verified by pid + create time."""
    stopped = []
    for job in runlog.jobs(run_id):
        if job["status"] not in (*ACTIVE, "restarting") or not job.get("pid"):
            continue
        outcome = procs.stop_tree(job["pid"], job["pgid"], job["pid_start_time"], grace=grace)
        runlog.update_job(job["id"], status="stopped", ended_at=time.time(), message=f"{why} ({outcome})")
        runlog.log_event(run_id, f"job {job['name']} stopped: {why} ({outcome})", job=job["name"])
        stopped.append(job["name"])
    return stopped


def stop_run(runlog: RunLog, run_id: str, *, grace: float = 10.0, wait: float | None = None) -> StopResult:
    """Stop a run from any process: ask its verified supervisor (SIGTERM), else stop its jobs directly."""
    run = runlog.get_run(run_id)
    run_id = run["id"]
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    if config.get("backend") == "slurm" and run["status"] in LIVE_RUN_STATUSES:
        from jobs import slurm

        slurm.cancel(str(config["slurm_job_id"]))
        runlog.finish_run(run_id, "stopped", note=f"slurm job {config['slurm_job_id']} cancelled")
        return StopResult(run_id, "stopped", "scancel")
    pid = supervisor_pid(run)
    if pid is not None:
        procs.signal_pid(pid, signal.SIGTERM)
        max_grace = max([grace, *(j.get("stop_grace", 10.0) for j in (config.get("jobs") or {}).values())])
        deadline = time.monotonic() + (wait if wait is not None else max_grace + 15.0)
        while time.monotonic() < deadline:
            current = runlog.get_run(run_id)
            if current["status"] not in LIVE_RUN_STATUSES and procs.start_time(pid) is None:
                return StopResult(run_id, current["status"], "supervisor")
            if procs.start_time(pid) is None and current["status"] in LIVE_RUN_STATUSES:
                break  # it died without recording the end: finish the job ourselves
            time.sleep(0.1)
        current = runlog.get_run(run_id)
        if current["status"] not in LIVE_RUN_STATUSES:
            return StopResult(run_id, current["status"], "supervisor")
        stopped = _stop_jobs_directly(runlog, run_id, grace, "stopped by adaflash runs stop")
        if supervisor_pid(current) == pid:
            procs.signal_pid(pid, signal.SIGKILL)
        runlog.finish_run(run_id, "stopped", note="stopped by adaflash runs stop (supervisor did not answer)")
        return StopResult(run_id, "stopped", "direct", stopped)
    stopped = _stop_jobs_directly(runlog, run_id, grace, "stopped by adaflash runs stop (supervisor gone)")
    if run["status"] in LIVE_RUN_STATUSES:
        runlog.finish_run(run_id, "stopped", note="stopped by adaflash runs stop (supervisor gone)")
        return StopResult(run_id, "stopped", "direct", stopped)
    return StopResult(run_id, run["status"], "already ended", stopped)
