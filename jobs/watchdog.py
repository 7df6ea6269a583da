"""The watchdog of a run: when its supervisor dies without recording the end, stop the jobs and record it.

Why: a supervisor killed outright (SIGKILL, the OOM killer) can neither stop its jobs nor record
how the run ended. The kernel sends each job SIGTERM (`adaflash.procs` starts them with a
parent-death signal), but nothing would wait for them, kill what ignores it, or record the
outcome: the run read "failed" while a job still ran, or while the job's own run read "finished".

The watchdog is a small process in its own session (a signal to the supervisor's group spares
it) that holds the read end of a pipe whose write end only the supervisor holds: end of file
means the supervisor has exited, however it exited. A run the supervisor recorded as ended
needs nothing; otherwise the watchdog records the run as failed at once (so readers reaping
lost runs leave it alone), stops each live job with its own grace period, records every job
as stopped, and lets the jobs' own runs that could not record their end be reaped.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.runlog import LIVE_JOB_STATUSES, LIVE_RUN_STATUSES, RunLog

WATCHDOG_LOG = "watchdog.log"  # in the run folder


def start_watchdog(workspace: str | os.PathLike, run_id: str, run_dir: Path) -> tuple[procs.ProcessGroup, int]:
    """Start the watchdog of `run_id`, supervised by this process (run by this interpreter: a recipe's own
    python may lack adaflash); returns it and the pipe's write end, which this process keeps open until the
    run is recorded as ended (then `os.close` it)."""
    read, write = os.pipe()  # both ends close on exec: no job inherits the write end
    try:
        group = procs.spawn([sys.executable, "-m", "jobs.watchdog", str(workspace), run_id, str(os.getpid())],
                            log=run_dir / WATCHDOG_LOG, stdin=read, die_with_parent=False)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return group, write


def take_over(runlog: RunLog, run_id: str, supervisor: int) -> list[str]:
    """What the dead supervisor left undone: stop the run's live jobs and record the end. Returns the jobs
    stopped (empty when the supervisor had recorded the end)."""
    run = runlog.get_run(run_id)
    jobs = [j for j in runlog.jobs(run_id) if j["status"] in LIVE_JOB_STATUSES]
    if run["status"] not in LIVE_RUN_STATUSES and not jobs:
        return []
    gone = procs.start_time(supervisor) is None  # else it let go of the run (an error before any job started)
    why = f"its supervisor (pid {supervisor}) {'died' if gone else 'stopped supervising'} without recording an end"
    if run["status"] in LIVE_RUN_STATUSES:
        runlog.finish_run(run_id, "failed", note=f"{why}; the run's watchdog is stopping its jobs")
    graces = {name: float(spec.get("stop_grace", 10.0))
              for name, spec in ((run.get("config") or {}).get("jobs") or {}).items() if isinstance(spec, dict)}
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        outcomes = list(pool.map(lambda job: _stop(job, graces.get(job["name"], 10.0)), jobs))
    stopped = []
    for job, outcome in zip(jobs, outcomes):
        message = f"{why}; stopped by the run's watchdog ({outcome})"
        runlog.update_job(job["id"], status="stopped", ended_at=time.time(), message=message)
        runlog.log_event(run_id, f"job {job['name']} stopped: {message}", level="warning", job=job["name"])
        stopped.append(job["name"])
    runlog.reap_lost_runs()  # the jobs' own runs that were killed before they could record their end
    note = f"{why}; the run's watchdog stopped its jobs" + (f" ({', '.join(stopped)})" if stopped else "")
    runlog.update_run(run_id, note=note)
    runlog.log_event(run_id, f"run failed: {note}", level="error")
    return stopped


def _stop(job: dict[str, Any], grace: float) -> str:
    if not job.get("pid"):
        return "not started"
    return procs.stop_tree(job["pid"], job.get("pgid"), job.get("pid_start_time"), grace=grace)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m jobs.watchdog WORKSPACE RUN_ID SUPERVISOR_PID", file=sys.stderr)
        return 2
    workspace, run_id, supervisor = args
    while os.read(0, 4096):  # the supervisor writes nothing: this returns at its exit
        pass
    stopped = take_over(RunLog.open(workspace), run_id, int(supervisor))
    if stopped:
        print(f"adaflash watchdog: supervisor {supervisor} of run {run_id} died; stopped {', '.join(stopped)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
