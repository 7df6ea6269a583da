"""Supervising a run in this process: GPU checks and leases, the loop, job reuse from the cache.

Library API for `adaflash run` (foreground) and for the background supervisor of a detached run
(jobs.detached); nothing here prints. Progress is read back from the run log (jobs.watch).

Caching (jobs.cache): a task with declared `outputs` whose key (command, code version, the
outputs of the jobs it comes after, its `inputs`) matches a record of an earlier successful run,
and whose outputs are still there unchanged, is marked `cached` instead of being started; a
rerun after a failure therefore resumes at the first job that did not finish.

Run life: the run row is created with kind "recipe", the resolved recipe as config, and
status running (pending while a detached supervisor starts); it ends finished, failed (a job
failed for good: every other job is then stopped) or stopped (a stop request). The process
supervising a run records itself (jobs.control) so that a stop from elsewhere reaches only it.
A supervisor that dies without recording the end (SIGKILL) leaves that to the run's watchdog
(jobs.watchdog): its jobs are stopped and the run recorded as failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.runlog import RunLog
from jobs.assign import AssignmentError, GpuLeases
from jobs.control import take_control_requests, write_supervisor_file
from jobs.plan import PreparedRun
from jobs.progress import format_seconds
from jobs.recipe_spec import Recipe
from jobs.supervisor import ACTIVE, DONE, JobState, Supervisor, exit_description
from jobs.watchdog import start_watchdog

EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 130}


def run_config(recipe: Recipe, use_cache: bool = True, rerun: Iterable[str] = ()) -> dict[str, Any]:
    """What the run log keeps as a recipe run's config: the resolved recipe and how to treat the cache."""
    return {**recipe.to_dict(), "run_options": {"use_cache": use_cache, "rerun": sorted(rerun)}}


def check_recipe_gpus(recipe: Recipe, inventory: Any = None) -> None:
    """Check the recipe's GPUs against `inventory` (a Snapshot or indices; default a real snapshot)."""
    if not recipe.gpus_in_use():
        return
    known = inventory
    if known is None:
        from jobs.gpus import snapshot

        known = snapshot(cpu_interval=None)
    errors = recipe.gpu_errors(known)
    if errors:
        raise AssignmentError(errors)


def check_recipe_ports(recipe: Recipe) -> None:
    """Refuse a launch whose services' local ports are taken (PortBusyError names the job, port and holder)."""
    from jobs.ports import PortBusyError, recipe_port_errors

    errors = recipe_port_errors((name, spec.ready.http) for name, spec in recipe.jobs.items()
                                if spec.kind == "service" and spec.ready is not None and spec.ready.http)
    if errors:
        raise PortBusyError(errors)


@dataclass
class RunResult:
    """How a run ended, as `adaflash run` reports it (and its exit code: see EXIT_CODES)."""

    run_id: str
    status: str  # finished | failed | stopped
    failed: list[str] = field(default_factory=list)
    message: str | None = None
    failed_logs: dict[str, str] = field(default_factory=dict)  # failed job -> its log file
    cached: list[str] = field(default_factory=list)  # jobs reused from earlier runs

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


class Runner:
    """Supervises one run in this process until it ends or a stop is requested.

    `inventory`: a gpus.Snapshot or a list of GPU indices to check the recipe against (default:
    a real snapshot, taken only when the recipe uses GPUs). `leases`: the GPU lease registry.
    `use_cache=False` runs every job (their records are refreshed); `rerun` names jobs to run even
    when a record matches.
    """

    def __init__(
        self,
        prepared: PreparedRun,
        runlog: RunLog,
        *,
        leases: GpuLeases | None = None,
        inventory: Any = None,
        tick: float = 0.2,
        python: str | None = None,
        on_change: Callable[[JobState, str], None] | None = None,
        existing_run: bool = False,
        use_cache: bool = True,
        rerun: Iterable[str] = (),
    ) -> None:
        self.prepared = prepared
        self.recipe = prepared.recipe
        self.run_id = prepared.run_id
        self.runlog = runlog
        self.leases = leases
        self.inventory = inventory
        self.tick = tick
        self.existing_run = existing_run
        self.supervisor = Supervisor(runlog, self.run_id, prepared.run_dir, workspace=prepared.workspace,
                                     python=python, on_change=on_change)
        self._stop = threading.Event()
        self._force = False
        self._stop_reason = "stop requested"
        self._started = False
        self._finishing = False
        self._order = self.recipe.order()
        self.cache = prepared.job_cache()
        self.use_cache = use_cache
        self.rerun = set(rerun)
        unknown = self.rerun - set(self.recipe.jobs)
        if unknown:
            raise ValueError(f"--rerun: no job {', '.join(sorted(unknown))} in recipe {self.recipe.name} "
                             f"(jobs: {', '.join(self._order)})")
        self._watchdog: procs.ProcessGroup | None = None
        self._watchdog_pipe: int | None = None  # held open while this process supervises the run
        self._keys: dict[str, str] = {}  # started cacheable job -> its key, recorded once it finishes
        self._digests: dict[str, str] = {}  # finished or reused cacheable job -> digest of its outputs

    # -- setup ----------------------------------------------------------------------------------
    def check_gpus(self) -> None:
        """Refuse GPUs that do not exist here (AssignmentError names role, job and GPU)."""
        check_recipe_gpus(self.recipe, self.inventory)

    def start(self) -> None:
        """Check GPUs, take the leases, record the run; raises before anything is started."""
        if self._started:
            return
        if not self.existing_run:
            self.check_gpus()
            check_recipe_ports(self.recipe)
        gpus = sorted(self.recipe.gpus_in_use())
        if gpus:
            self.leases = self.leases or GpuLeases()
            self.leases.acquire(self.run_id, gpus)  # LeaseError: another live run holds one
        try:
            self.prepared.run_dir.mkdir(parents=True, exist_ok=True)
            if self.existing_run:
                self.runlog.update_run(self.run_id, status="running", pid=os.getpid())
            else:
                self.runlog.create_run("recipe", name=self.recipe.name,
                                       config=run_config(self.recipe, self.use_cache, self.rerun),
                                       run_dir=str(self.prepared.run_dir), run_id=self.run_id, status="running")
            write_supervisor_file(self.prepared.run_dir, self.run_id)
            self._watchdog, self._watchdog_pipe = start_watchdog(self.prepared.workspace, self.run_id,
                                                                 self.prepared.run_dir)
            self.runlog.log_event(self.run_id, f"run started: recipe {self.recipe.name}, "
                                               f"{len(self._order)} job(s), supervisor pid {os.getpid()}, "
                                               f"watchdog pid {self._watchdog.pid}")
            for name in self._order:
                self.supervisor.add(self.recipe.jobs[name])
        except BaseException:
            if gpus and self.leases:
                self.leases.release(self.run_id)
            self._release_watchdog()
            raise
        self._started = True

    def _release_watchdog(self) -> None:
        """The run's end is recorded (or nothing started): the watchdog sees the pipe close and exits."""
        if self._watchdog_pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._watchdog_pipe)
            self._watchdog_pipe = None

    # -- control ----------------------------------------------------------------------------------
    def request_stop(self, force: bool = False, reason: str = "stop requested") -> None:
        """Thread- and signal-safe: the loop stops every job and ends the run as stopped.

        A second request (a second Ctrl-C) forces: no more grace, SIGKILL to every job group now.
        """
        if self._stop.is_set():
            force = True
        else:
            self._stop_reason = reason
        self._force = self._force or force
        self._stop.set()
        if force and self._finishing:
            self.kill_now()

    def kill_now(self) -> None:
        """SIGKILL every live job group at once (each verified by pid + create time)."""
        for state in list(self.supervisor.jobs.values()):
            if state.group is not None and state.status in ACTIVE:
                state.group.stop(grace=0.0)

    def _consume_control(self) -> None:
        """Act on the requests other processes left for this run (jobs.control.request_job_action)."""
        for request in take_control_requests(self.prepared.run_dir):
            action, job = request.get("action"), request.get("job")
            if action == "stop-run":
                self.request_stop(reason="stop requested")
            elif job in self.supervisor.jobs and action == "stop":
                self.supervisor.stop(job, why="stopped on request")
            elif job in self.supervisor.jobs and action == "restart":
                self.runlog.log_event(self.run_id, f"restart of job {job} requested", job=job)
                self.supervisor.restart(job)
            else:
                self.runlog.log_event(self.run_id, f"ignored control request {request!r}", level="warning")

    # -- the loop ---------------------------------------------------------------------------------
    def step(self) -> str | None:
        """One tick: control requests, supervision, starts of ready jobs. The outcome once decided."""
        self._consume_control()
        self.supervisor.poll()
        jobs = self.supervisor.jobs
        for name in list(self._keys):  # recorded first: the jobs after it are keyed on its outputs
            if jobs[name].status == "finished":
                self._save(name)
        for name in self._order:
            state = jobs[name]
            if state.status != "pending":
                continue
            deps = [jobs[d] for d in state.spec.after]
            blocked = [d for d in deps if d.done_for_good and not d.satisfied]
            if blocked:
                self.supervisor.stop(name, why=f"not started: {blocked[0].name} {blocked[0].status}")
            elif all(d.satisfied for d in deps) and not self._reuse(name):
                self.supervisor.start(name)
        states = list(jobs.values())
        if any(s.status == "failed" and s.restart_at is None for s in states):
            return "failed"
        tasks = [s for s in states if s.spec.kind == "task"]
        if tasks and all(s.done_for_good for s in tasks):
            return "finished" if all(s.status in DONE for s in tasks) else "stopped"
        if states and all(s.done_for_good for s in states):
            return "stopped"
        return None

    # -- the cache ----------------------------------------------------------------------------------
    def _reuse(self, name: str) -> bool:
        """Mark the job cached when its record matches; otherwise clear its stale outputs (and run it)."""
        spec = self.recipe.jobs[name]
        if self.cache is None or not spec.cacheable:
            return False
        upstream = {d: self._digests.get(d) or f"ran in run {self.run_id}" for d in spec.after}
        key = self.cache.key(spec, upstream)
        if self.use_cache and name not in self.rerun:
            record = self.cache.lookup(spec, key)
            if record:
                self._digests[name] = record["outputs_digest"]
                took = record.get("duration")
                note = f"reused the outputs of run {record.get('run_id')}" + (
                    f" (it took {format_seconds(took)})" if isinstance(took, (int, float)) else "")
                self.supervisor.mark_cached(name, note)
                return True
        removed = self.cache.forget(spec)
        if removed:
            self.runlog.log_event(self.run_id, f"job {name}: removed its earlier outputs {', '.join(removed)}",
                                  job=name)
        self._keys[name] = key
        return False

    def _save(self, name: str) -> None:
        state = self.supervisor.jobs[name]
        key = self._keys.pop(name)
        duration = (state.ended_at - state.started_at) if state.ended_at and state.started_at else None
        record = self.cache.save(state.spec, key, run_id=self.run_id, duration=duration,
                                 log_path=str(state.log_path)) if self.cache else None
        if record:
            self._digests[name] = record["outputs_digest"]
        else:
            missing = [o for o in state.spec.outputs if not Path(o).exists()]
            self.runlog.log_event(self.run_id, f"job {name} finished without its outputs {', '.join(missing)}: "
                                               "not cached, and the jobs after it will run again next time",
                                  level="warning", job=name)

    def run(self, on_tick: Callable[[Runner], None] | None = None) -> RunResult:
        """Supervise until the run ends; always stops every job and releases the leases."""
        self.start()
        outcome: str | None = None
        try:
            while outcome is None:
                if self._stop.is_set():
                    outcome = "stopped"
                    break
                outcome = self.step()
                if on_tick:
                    on_tick(self)
                if outcome is None:
                    self._stop.wait(self.tick)
        finally:
            result = self._finish(outcome or "stopped")
        return result

    def _finish(self, outcome: str) -> RunResult:
        self._finishing = True
        jobs = self.supervisor.jobs
        failed = [n for n, s in jobs.items() if s.status == "failed"]
        why = {"failed": f"run failed ({', '.join(failed)} failed)", "finished": "run finished",
               "stopped": self._stop_reason}[outcome]
        try:
            grace = 0.0 if self._force else None
            self.supervisor.stop_all(grace=grace, why=why)
        finally:
            if self.leases is not None:
                with contextlib.suppress(Exception):
                    self.leases.release(self.run_id)
        cached = [n for n, s in jobs.items() if s.status == "cached"]
        message = {"finished": "every task finished", "stopped": self._stop_reason}.get(outcome, why)
        if outcome == "finished" and cached:
            message += f" ({len(cached)} reused from earlier runs: {', '.join(cached)})"
        if failed:
            first = jobs[failed[0]]
            reason = (first.message or "").splitlines()[0] if first.message else exit_description(first.exit_code)
            step = self._order.index(first.name) + 1
            message = f"step {step}/{len(self._order)}: job {first.name} failed: {reason}; log: {first.log_path}"
        self.runlog.log_event(self.run_id, f"run {outcome}: {message}",
                              level="error" if outcome == "failed" else "info")
        self.runlog.finish_run(self.run_id, outcome, note=message)
        self._release_watchdog()
        return RunResult(self.run_id, outcome, failed, message,
                         failed_logs={n: str(jobs[n].log_path) for n in failed}, cached=cached)


def install_signal_handlers(runner: Runner) -> Callable[[], None]:
    """SIGINT/SIGTERM/SIGHUP -> stop the run (a second signal: no grace). Returns a restore function."""
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        runner.request_stop(reason=f"stopped by {signal.Signals(signum).name}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, old)

    return restore
