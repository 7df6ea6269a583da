"""Detached runs: the recipe supervised by a background process that outlives the caller.

`start_detached` validates, leases the GPUs and records the run as pending, then starts the
hidden `adaflash run --foreground-supervisor RUN_ID`, whose `supervise_existing` rebuilds the
resolved recipe from the run log and runs it with a Runner; the leases pass to that process.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.runlog import RunLog
from adaflash.workspace import workspace_dir
from jobs.assign import GpuLeases
from jobs.control import write_supervisor_file
from jobs.plan import PreparedRun, prepare
from jobs.recipe_spec import Recipe
from jobs.runner import (
    Runner,
    RunResult,
    check_recipe_gpus,
    check_recipe_ports,
    install_signal_handlers,
    run_config,
)
from jobs.supervisor import tail_text

SUPERVISOR_LOG = "supervisor.log"  # in the run folder: what the background supervisor printed


def supervisor_command(workspace: str | os.PathLike, run_id: str, python: str | None = None) -> list[str]:
    """The hidden entry that supervises a detached run."""
    return [python or sys.executable, "-m", "adaflash.cli.main", "--workspace", str(workspace), "run",
            "--foreground-supervisor", run_id]


def start_detached(
    prepared: PreparedRun,
    runlog: RunLog,
    *,
    leases: GpuLeases | None = None,
    inventory: Any = None,
    wait: float = 20.0,
    python: str | None = None,
    use_cache: bool = True,
    rerun: Iterable[str] = (),
) -> str:
    """Validate, lease and record the run, then supervise it in a background process.

    Returns the run id once the background supervisor has taken over. Raises AssignmentError (a
    PortBusyError when a service's port is taken), LeaseError, or RuntimeError (with the supervisor
    log's tail) if it could not start.
    """
    check_recipe_gpus(prepared.recipe, inventory)
    check_recipe_ports(prepared.recipe)
    gpus = sorted(prepared.recipe.gpus_in_use())
    leases = leases or (GpuLeases() if gpus else None)
    if gpus and leases is not None:
        leases.acquire(prepared.run_id, gpus)
    try:
        prepared.run_dir.mkdir(parents=True, exist_ok=True)
        runlog.create_run("recipe", name=prepared.recipe.name,
                          config=run_config(prepared.recipe, use_cache, rerun),
                          run_dir=str(prepared.run_dir), run_id=prepared.run_id, status="pending")
        child = _spawn_supervisor(prepared, leases, python)
        if gpus and leases is not None:
            leases.transfer(prepared.run_id, child.pid)
        runlog.update_run(prepared.run_id, pid=child.pid)
        write_supervisor_file(prepared.run_dir, prepared.run_id, child.pid)
    except BaseException:
        if gpus and leases is not None:
            leases.release(prepared.run_id)
        raise
    run_id = _await_takeover(prepared, runlog, child, wait)
    reap_when_done(child)
    return run_id


def reap_when_done(child: procs.ProcessGroup) -> threading.Thread:
    """Collect the supervisor's exit status when it ends: a caller that lives on (the dashboard) would
    otherwise keep it as a zombie until its next subprocess. A daemon thread: it never holds up an exit."""
    thread = threading.Thread(target=child.wait, name=f"reap supervisor {child.pid}", daemon=True)
    thread.start()
    return thread


def _spawn_supervisor(
    prepared: PreparedRun, leases: GpuLeases | None, python: str | None
) -> procs.ProcessGroup:
    """The background supervisor: its own session, meant to outlive us (no parent-death signal), output
    appended to supervisor.log."""
    env = dict(os.environ)
    if leases is not None:
        env["ADAFLASH_LEASES"] = str(leases.path)
    return procs.spawn(supervisor_command(prepared.workspace, prepared.run_id, python),
                       log=prepared.run_dir / SUPERVISOR_LOG, env=env, die_with_parent=False)


def _await_takeover(
    prepared: PreparedRun, runlog: RunLog, child: procs.ProcessGroup, wait: float
) -> str:
    """The run id once the supervisor has moved the run on from pending (or is still alive after `wait`).

    A supervisor that exited first fails the run, with the tail of its log in the RuntimeError.
    """
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = runlog.get_run(prepared.run_id)["status"]
        if status != "pending":
            return prepared.run_id
        if child.poll() is not None:
            break
        time.sleep(0.1)
    if child.poll() is None:
        return prepared.run_id  # slow to start but alive: attach will show it
    runlog.finish_run(prepared.run_id, "failed", note="the background supervisor did not start")
    log_tail = tail_text(prepared.run_dir / SUPERVISOR_LOG)
    raise RuntimeError(f"the background supervisor exited with code {child.returncode}:\n{log_tail}")

def launch_detached(
    recipe_path: str | os.PathLike,
    overrides: Iterable[str] = (),
    *,
    workspace: str | os.PathLike | None = None,
    inventory: Any = None,
) -> str:
    """Plan, check and start a recipe run in the background in one call (what the TUI launches).

    Raises RecipeError, AssignmentError, LeaseError or RuntimeError before anything runs.
    """
    prepared = prepare(recipe_path, overrides, workspace=workspace)
    return start_detached(prepared, RunLog.open(prepared.workspace), inventory=inventory)


def supervise_existing(workspace: str | os.PathLike, run_id: str, *, tick: float = 0.2) -> RunResult:
    """Entry of the background supervisor: run the recorded (resolved) recipe of `run_id`."""
    runlog = RunLog.open(workspace)
    run = runlog.get_run(run_id)
    if run["status"] != "pending" or run["kind"] != "recipe":
        raise RuntimeError(f"run {run['id']} is {run['status']}: only a pending recipe run can be supervised")
    recipe = Recipe.from_dict(run["config"])
    prepared = PreparedRun(recipe=recipe, run_id=run["id"], run_dir=Path(run["run_dir"]),
                           workspace=workspace_dir(workspace))
    options = run["config"].get("run_options") or {}
    runner = Runner(prepared, runlog, existing_run=True, tick=tick, use_cache=options.get("use_cache", True),
                    rerun=options.get("rerun") or ())
    restore = install_signal_handlers(runner)
    try:
        return runner.run()
    finally:
        restore()
