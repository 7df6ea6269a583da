"""Running a recipe: plan, GPU checks and leases, the supervision loop, detach/attach/stop.

Library API for `adaflash run`, `adaflash runs attach|stop` and the TUI; nothing here prints.
Progress is read back from the run log (`run_view`, `follow_run`), which works the same for a
run supervised in this process and for one detached into the background.

Caching (jobs.cache): a task with declared `outputs` whose key (command, code version, the
outputs of the jobs it comes after, its `inputs`) matches a record of an earlier successful run,
and whose outputs are still there unchanged, is marked `cached` instead of being started; a
rerun after a failure therefore resumes at the first job that did not finish.

Run life: the run row is created with kind "recipe", the resolved recipe as config, and
status running (pending while a detached supervisor starts); it ends finished, failed (a job
failed for good: every other job is then stopped) or stopped (a stop request). The process
supervising a run is recorded in runs.pid and, with its create time, in
`<run_dir>/supervisor.json`, so `stop_run` only ever signals that very process.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaflash.runlog import RunLog, new_run_id
from adaflash.workspace import DEFAULT_WORKSPACE, WORKSPACE_ENV, workspace_dir
from jobs import procs
from jobs.assign import AssignmentError, GpuLeases
from jobs.cache import JobCache
from jobs.progress import format_seconds
from jobs.recipe import Recipe, load_recipe
from jobs.supervisor import ACTIVE, DONE, JobState, Supervisor, exit_description

SUPERVISOR_FILE = "supervisor.json"
CONTROL_DIR = "control"
LIVE_RUN_STATUSES = ("pending", "running", "detached")
EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 130}
CONTROL_ACTIONS = ("stop", "restart", "stop-run")


# -- plan --------------------------------------------------------------------------------------


@dataclass
class PlanRow:
    """One job as it will start: the exact argv, its GPUs and its conditions."""

    name: str
    kind: str
    role: str | None
    gpus: str
    cuda_visible_devices: str | None
    after: list[str]
    ready: str | None
    restart: str
    argv: list[str]
    env: dict[str, str]
    log_path: str
    outputs: list[str] = field(default_factory=list)
    cache: str | None = None  # what a run started now would do with the job's cache record

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "command_line": self.command_line}


@dataclass
class PreparedRun:
    """A validated recipe bound to a run id, run folder and workspace; nothing started yet."""

    recipe: Recipe
    run_id: str
    run_dir: Path
    workspace: Path

    @property
    def cache_dir(self) -> Path | None:
        raw = self.recipe.context.get("cache_dir")
        return Path(raw) if raw else None

    def job_cache(self) -> JobCache | None:
        if self.cache_dir is None:
            return None
        return JobCache(self.cache_dir, safe_roots=[self.workspace], packages=self.recipe.code,
                        protected=[self.workspace / "runs", self.workspace / "runlog.sqlite"])

    def cache_preview(self, rerun: Iterable[str] = ()) -> dict[str, str]:
        """For each cacheable job, what a run started now would do: reuse it (and from which run) or run it.

        A job can only be foreseen as reused when every job it comes after is too.
        """
        cache = self.job_cache()
        if cache is None:
            return {}
        rerun = set(rerun)
        digests: dict[str, str] = {}
        out: dict[str, str] = {}
        for name in self.recipe.order():
            spec = self.recipe.jobs[name]
            if not spec.cacheable:
                continue
            if any(d not in digests for d in spec.after) or name in rerun:
                out[name] = "runs (asked)" if name in rerun else "runs (an earlier job runs)"
                continue
            record = cache.lookup(spec, cache.key(spec, {d: digests[d] for d in spec.after}))
            if record:
                digests[name] = record["outputs_digest"]
                out[name] = f"reused (outputs of run {record.get('run_id')})"
            else:
                out[name] = "runs (no record with this key)" if cache.record(name) is None else \
                    "runs (command, code or inputs changed, or outputs missing)"
        return out

    def plan(self, python: str | None = None, *, preview: bool = False, use_cache: bool = True,
             rerun: Iterable[str] = ()) -> list[PlanRow]:
        """The jobs in start order; `preview` also says what the cache would do (see cache_preview)."""
        rows = []
        cached = {}
        if preview:
            cached = self.cache_preview(rerun) if use_cache else {
                n: "runs (--no-cache)" for n, j in self.recipe.jobs.items() if j.cacheable}
        for name in self.recipe.order():
            spec = self.recipe.jobs[name]
            restart = "never" if spec.restart.mode == "never" else (
                f"on-failure (max {spec.restart.max_restarts}, back-off {spec.restart.backoff:g}s)")
            rows.append(PlanRow(
                name=name, kind=spec.kind, role=spec.role, gpus=spec.gpus_label,
                cuda_visible_devices=spec.cuda_visible_devices, after=list(spec.after),
                ready=(f"{spec.ready.describe()} within {spec.ready.timeout:g}s" if spec.ready else None),
                restart=restart, argv=spec.argv(python), env=dict(spec.env),
                log_path=str(self.run_dir / f"{name}.log"), outputs=list(spec.outputs) if spec.cacheable else [],
                cache=cached.get(name),
            ))
        return rows

    def plan_text(self, python: str | None = None, *, use_cache: bool = True, rerun: Iterable[str] = ()) -> str:
        """The plan as plain text: what `adaflash run --dry-run` prints."""
        lines = [f"run {self.run_id}: recipe {self.recipe.name} ({self.recipe.path})",
                 f"workspace {self.workspace}", f"run folder {self.run_dir}"]
        if self.cache_dir and any(j.cacheable for j in self.recipe.jobs.values()):
            lines.append(f"cache folder {self.cache_dir}")
        if self.recipe.assignment.roles:
            roles = ", ".join(f"{r}={g.cuda_visible_devices or 'cpu'}" for r, g in self.recipe.assignment.roles.items())
            lines.append(f"gpus {roles} (share={'yes' if self.recipe.assignment.share else 'no'})")
        for i, row in enumerate(self.plan(python, preview=True, use_cache=use_cache, rerun=rerun), start=1):
            visible = ("(unset: places its own workers)" if row.cuda_visible_devices is None
                       else repr(row.cuda_visible_devices))
            lines.append(f"\n{i}. {row.name} [{row.kind}{', role ' + row.role if row.role else ''}] "
                         f"GPUs {row.gpus}, CUDA_VISIBLE_DEVICES={visible}")
            if row.after:
                lines.append(f"   after: {', '.join(row.after)}")
            if row.ready:
                lines.append(f"   ready: {row.ready}")
            if row.restart != "never":
                lines.append(f"   restart: {row.restart}")
            for key, value in row.env.items():
                lines.append(f"   env: {key}={value}")
            lines.append(f"   $ {row.command_line}")
            lines.append(f"   log: {row.log_path}")
            if row.outputs:
                lines.append(f"   outputs (cached): {', '.join(row.outputs)}" + (f" -> {row.cache}" if row.cache else ""))
        return "\n".join(lines)


def workspace_path(explicit: str | os.PathLike | None = None) -> Path:
    """Where the workspace is (as adaflash.workspace decides) without creating it: a plan has no side effects."""
    raw = explicit or os.environ.get(WORKSPACE_ENV) or DEFAULT_WORKSPACE
    return Path(raw).expanduser().resolve()


def prepare(
    recipe_path: str | os.PathLike,
    overrides: Iterable[str] = (),
    *,
    workspace: str | os.PathLike | None = None,
    run_id: str | None = None,
) -> PreparedRun:
    """Load and validate a recipe for a new run (RecipeError on any mistake). Creates no run."""
    overrides = list(overrides)
    first = load_recipe(recipe_path, overrides)  # validates, and tells the recipe's own workspace
    ws = workspace_path(workspace or first.workspace)
    run_id = run_id or new_run_id("recipe")
    run_dir = ws / "runs" / run_id
    cache_dir = ws / Path(first.cache_dir).expanduser() if first.cache_dir else ws / "cache" / first.name
    context = {"run_id": run_id, "run_dir": str(run_dir), "workspace": str(ws), "cache_dir": str(cache_dir)}
    recipe = load_recipe(recipe_path, overrides, context=context)
    return PreparedRun(recipe=recipe, run_id=run_id, run_dir=run_dir, workspace=ws)


# -- supervisor identity and control requests ------------------------------------------------------


def write_supervisor_file(run_dir: Path, run_id: str, pid: int | None = None) -> dict[str, Any]:
    pid = pid or os.getpid()
    info = {"run_id": run_id, "pid": pid, "pid_start_time": procs.start_time(pid), "host": os.uname().nodename}
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{SUPERVISOR_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, run_dir / SUPERVISOR_FILE)
    return info


def supervisor_pid(run: dict[str, Any]) -> int | None:
    """The live process supervising `run` (verified by create time or command line), else None."""
    pid = run.get("pid")
    if not pid or not run.get("run_dir"):
        return None
    try:
        info = json.loads((Path(run["run_dir"]) / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("pid") == pid and procs.is_ours(pid, info.get("pid_start_time")):
        return pid
    if procs.start_time(pid) is None:
        return None
    with contextlib.suppress(Exception):
        import psutil

        if run["id"] in psutil.Process(pid).cmdline():
            return pid
    return None


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


# -- the runner ------------------------------------------------------------------------------------


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


@dataclass
class RunResult:
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
            self.runlog.log_event(self.run_id, f"run started: recipe {self.recipe.name}, "
                                               f"{len(self._order)} job(s), supervisor pid {os.getpid()}")
            for name in self._order:
                self.supervisor.add(self.recipe.jobs[name])
        except BaseException:
            if gpus and self.leases:
                self.leases.release(self.run_id)
            raise
        self._started = True

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
            if state.pid and state.status in ACTIVE:
                procs.stop_tree(state.pid, state.pgid, state.pid_start_time, grace=0.0)

    def _consume_control(self) -> None:
        folder = self.prepared.run_dir / CONTROL_DIR
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.json")):
            try:
                request = json.loads(path.read_text())
            except (OSError, ValueError):
                request = {}
            with contextlib.suppress(OSError):
                path.unlink()
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


# -- detached runs -----------------------------------------------------------------------------------


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

    Returns the run id once the background supervisor has taken over. Raises AssignmentError,
    LeaseError, or RuntimeError (with the supervisor log's tail) if it could not start.
    """
    check_recipe_gpus(prepared.recipe, inventory)
    gpus = sorted(prepared.recipe.gpus_in_use())
    leases = leases or (GpuLeases() if gpus else None)
    if gpus and leases is not None:
        leases.acquire(prepared.run_id, gpus)
    try:
        prepared.run_dir.mkdir(parents=True, exist_ok=True)
        runlog.create_run("recipe", name=prepared.recipe.name, config=run_config(prepared.recipe, use_cache, rerun),
                          run_dir=str(prepared.run_dir), run_id=prepared.run_id, status="pending")
        env = dict(os.environ)
        if leases is not None:
            env["ADAFLASH_LEASES"] = str(leases.path)
        log_path = prepared.run_dir / "supervisor.log"
        with open(log_path, "ab") as log:
            child = subprocess.Popen(
                supervisor_command(prepared.workspace, prepared.run_id, python), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, env=env,
            )
        if gpus and leases is not None:
            leases.transfer(prepared.run_id, child.pid)
        runlog.update_run(prepared.run_id, pid=child.pid)
        write_supervisor_file(prepared.run_dir, prepared.run_id, child.pid)
    except BaseException:
        if gpus and leases is not None:
            leases.release(prepared.run_id)
        raise
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = runlog.get_run(prepared.run_id)["status"]
        if status != "pending":
            return prepared.run_id
        if child.poll() is not None:
            break
        time.sleep(0.1)
    from jobs.supervisor import tail_text

    if child.poll() is None:
        return prepared.run_id  # slow to start but alive: attach will show it
    runlog.finish_run(prepared.run_id, "failed", note="the background supervisor did not start")
    raise RuntimeError(f"the background supervisor exited with code {child.returncode}:\n{tail_text(log_path)}")


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


# -- reading a run back, and stopping it from anywhere -----------------------------------------------


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


def child_runs(runlog: RunLog, run: dict[str, Any], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs that the run's jobs created themselves (e.g. `adaflash bench matrix`): same host, created
    after the run, by a pid of one of its jobs. Each gets a `job` key."""
    by_pid = {j["pid"]: j["name"] for j in jobs if j.get("pid")}
    if not by_pid:
        return []
    out = []
    for other in runlog.runs_since(run["created_at"]):
        if other["id"] != run["id"] and other.get("pid") in by_pid and other.get("host") == run.get("host"):
            out.append({**other, "job": by_pid[other["pid"]]})
    return out


def run_view(runlog: RunLog, run_id: str, *, events_after: int = 0) -> RunView:
    run = runlog.get_run(run_id)
    jobs = runlog.jobs(run["id"])
    children = child_runs(runlog, run, jobs)
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


@dataclass
class StopResult:
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
        os.kill(pid, signal.SIGTERM)
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runlog.finish_run(run_id, "stopped", note="stopped by adaflash runs stop (supervisor did not answer)")
        return StopResult(run_id, "stopped", "direct", stopped)
    stopped = _stop_jobs_directly(runlog, run_id, grace, "stopped by adaflash runs stop (supervisor gone)")
    if run["status"] in LIVE_RUN_STATUSES:
        runlog.finish_run(run_id, "stopped", note="stopped by adaflash runs stop (supervisor gone)")
        return StopResult(run_id, "stopped", "direct", stopped)
    return StopResult(run_id, run["status"], "already ended", stopped)
