"""Supervision of job processes: start, readiness, restart policy, stop, all recorded in the run log.

Each job is started with `adaflash.procs.spawn`: its own session/process group, SIGTERM when the
supervisor dies (Linux), stdout+stderr appended to `<run_dir>/<job>.log`; so one signal to the
group reaches its children too, a Ctrl-C in the terminal reaches only the supervisor, which then
stops the jobs in order, and a supervisor killed outright leaves no job behind.

The supervisor is driven by `poll()` (one non-blocking tick: exits, readiness, due restarts);
the caller owns the loop (jobs.runner, the TUI, `adaflash bench matrix`). It never prints:
every change goes to the run log (jobs row + events) and to the optional `on_change` callback.
Use it from one thread; `stop_all` signals in parallel but writes the log from the caller's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaflash import procs
from jobs import ports
from jobs.recipe_spec import JobSpec

ACTIVE = ("starting", "running", "ready")
TERMINAL = ("finished", "failed", "stopped", "cached")  # cached: reused from an earlier run, never started
DONE = ("finished", "cached")  # a task whose outputs the next jobs may use
TAIL_LINES = 20
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def clean_log_text(text: str) -> str:
    """What a terminal would show: escape sequences dropped, a carriage return overwrites its line."""
    text = _ANSI.sub("", text.replace("\r\n", "\n"))
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line else line for line in text.split("\n"))


def tail_text(path: str | os.PathLike, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last lines of a log file as a terminal shows them ("" when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return ""
    text = clean_log_text(data.decode(errors="replace"))
    return "\n".join(text.rstrip("\n").split("\n")[-lines:]) if text.strip() else ""


def exit_description(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """GET url answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - the recipe's own URL
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class JobState:
    """What the supervisor knows of one job now; mirrored in the run log's jobs row."""

    spec: JobSpec
    job_id: int
    log_path: Path
    status: str = "pending"
    group: procs.ProcessGroup | None = None  # the latest start's
    restarts: int = 0
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    ready_deadline: float | None = None
    next_check: float = 0.0
    log_offset: int = 0
    log_buffer: str = ""
    restart_at: float | None = None
    stop_requested: bool = False
    message: str | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.group.pid if self.group is not None else None

    @property
    def pgid(self) -> int | None:
        return self.group.pgid if self.group is not None else None

    @property
    def pid_start_time(self) -> float | None:
        return self.group.pid_start_time if self.group is not None else None

    @property
    def alive(self) -> bool:
        return self.group is not None and self.group.alive()

    @property
    def satisfied(self) -> bool:
        """Whether jobs that come `after` this one may start."""
        if self.spec.kind == "task":
            return self.status in DONE
        return self.status == "ready" or (self.spec.ready is None and self.status == "running")

    @property
    def done_for_good(self) -> bool:
        """Terminal, with no restart pending."""
        return self.status in TERMINAL and self.restart_at is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "job_id": self.job_id, "kind": self.spec.kind, "role": self.spec.role,
            "gpus": self.spec.gpus_label, "status": self.status, "pid": self.pid, "restarts": self.restarts,
            "exit_code": self.exit_code, "started_at": self.started_at, "ended_at": self.ended_at,
            "log_path": str(self.log_path), "message": self.message, "argv": self.argv,
        }


class Supervisor:
    """Starts and watches the jobs of one run."""

    def __init__(
        self,
        runlog: Any,
        run_id: str,
        run_dir: str | os.PathLike,
        *,
        workspace: str | os.PathLike | None = None,
        base_env: dict[str, str] | None = None,
        python: str | None = None,
        on_change: Callable[[JobState, str], None] | None = None,
    ) -> None:
        self.runlog = runlog
        self.run_id = run_id
        self.run_dir = Path(run_dir)  # created with the first job: a refused run leaves no folder
        self.workspace = str(workspace) if workspace else None
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.python = python or sys.executable
        self.on_change = on_change
        self.jobs: dict[str, JobState] = {}
        self._lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------------------------------
    def _record(self, state: JobState, event: str | None = None, level: str = "info", **fields: Any) -> None:
        self.runlog.update_job(state.job_id, **fields)
        if event:
            self.runlog.log_event(self.run_id, event, level=level, job=state.name)
        if self.on_change:
            self.on_change(state, event or state.status)

    def add(self, spec: JobSpec) -> JobState:
        """Register a job (row status pending); start it later with start()."""
        if spec.name in self.jobs:
            return self.jobs[spec.name]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.run_dir / f"{spec.name}.log"
        argv = spec.argv(self.python)
        job_id = self.runlog.add_job(self.run_id, spec.name, argv, role=spec.role, gpus=spec.gpus_label,
                                     log_path=str(log_path), status="pending")
        state = JobState(spec=spec, job_id=job_id, log_path=log_path, argv=argv)
        self.jobs[spec.name] = state
        return state

    def env_for(self, spec: JobSpec) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["ADAFLASH_RUN_ID"] = self.run_id
        env["ADAFLASH_RUN_DIR"] = str(self.run_dir)
        env["ADAFLASH_JOB"] = spec.name
        if self.workspace:
            env["ADAFLASH_WORKSPACE"] = self.workspace
        visible = spec.cuda_visible_devices
        if visible is not None:  # a launcher keeps ours: its GPU indices count the GPUs we see, as roles' do
            env["CUDA_VISIBLE_DEVICES"] = visible
        return env

    def mark_cached(self, name: str, note: str) -> JobState:
        """A task reused from an earlier run: recorded as `cached`, nothing started."""
        state = self.jobs[name]
        state.status = "cached"
        state.ended_at = time.time()
        state.message = note
        with open(state.log_path, "ab") as log:
            log.write(f"=== adaflash: job {name} not run: {note}\n".encode())
        self._record(state, f"job {name} cached: {note}", status="cached", ended_at=state.ended_at, message=note)
        return state

    # -- start ----------------------------------------------------------------------------------
    def start(self, name: str) -> JobState:
        """Spawn the job's process (in its own process group) and record it."""
        state = self.jobs[name]
        spec = state.spec
        state.stop_requested = False
        state.restart_at = None
        header = (f"\n=== adaflash: start {state.restarts + 1} of job {name} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {subprocess.list2cmdline(state.argv)}\n")
        busy = self._busy_port(spec)
        with open(state.log_path, "ab") as log:
            log.write(header.encode())
            log.flush()
            state.log_offset = log.tell()
            state.log_buffer = ""
            if busy:
                state.status, state.exit_code, state.ended_at, state.message = "failed", None, time.time(), busy
                log.write(f"=== adaflash: not started: {busy}\n".encode())
                self._record(state, f"job {name} failed: {busy}", "error", status="failed", message=busy,
                             ended_at=state.ended_at)
                return state
            try:
                group = procs.spawn(state.argv, log=log, env=self.env_for(spec), cwd=spec.cwd)
            except OSError as err:
                state.status, state.exit_code, state.ended_at = "failed", None, time.time()
                state.message = f"could not start {state.argv[0]!r}: {err.strerror or err}"
                log.write(f"=== adaflash: {state.message}\n".encode())
                self._record(state, f"job {name} failed: {state.message}", "error", status="failed",
                             message=state.message, ended_at=state.ended_at)
                return state
        state.group = group
        state.started_at = group.started_at
        state.ended_at = None
        state.exit_code = None
        state.message = None
        if spec.ready is not None:
            state.status = "starting"
            state.ready_deadline = time.monotonic() + spec.ready.timeout
            state.next_check = 0.0
        else:
            state.status = "running"
            state.ready_deadline = None
        self._record(
            state, f"job {name} started (pid {group.pid}, GPUs {spec.gpus_label})", status=state.status,
            pid=state.pid, pgid=state.pgid, pid_start_time=state.pid_start_time, started_at=state.started_at,
            ended_at=None, exit_code=None, restarts=state.restarts, message=None, command=state.argv,
        )
        return state

    @staticmethod
    def _busy_port(spec: JobSpec) -> str | None:
        """Why a service cannot start: the local port its readiness URL names is taken (else None)."""
        endpoint = ports.url_endpoint(spec.ready.http) if spec.ready is not None and spec.ready.http else None
        if spec.kind != "service" or endpoint is None or ports.port_free(*endpoint):
            return None
        return ports.busy_message(*endpoint, f"job {spec.name}")

    # -- the tick ---------------------------------------------------------------------------------
    def poll(self) -> None:
        """One non-blocking pass: exits, readiness checks, due restarts."""
        now = time.monotonic()
        for state in list(self.jobs.values()):
            if state.restart_at is not None and now >= state.restart_at:
                state.restarts += 1
                self.runlog.log_event(
                    self.run_id, f"restarting job {state.name} ({state.restarts}/{state.spec.restart.max_restarts})",
                    level="warning", job=state.name)
                self.start(state.name)
                continue
            if state.group is None or state.status not in ACTIVE:
                continue
            code = state.group.poll()
            if code is not None:
                self._exited(state, code)
                continue
            if state.status == "starting":
                self._check_ready(state, now)

    def _check_ready(self, state: JobState, now: float) -> None:
        ready = state.spec.ready
        assert ready is not None
        if now < state.next_check:
            return
        state.next_check = now + ready.interval
        ok = http_ok(ready.http, timeout=min(2.0, max(0.2, ready.interval * 2))) if ready.http else \
            self._log_matches(state, ready.log or "")
        foreign = ports.foreign_answer(ready.http, ports.job_processes(state.pid, state.pgid, state.pid_start_time)) \
            if ok and ready.http else None
        if foreign:
            self._stop_process(state, state.spec.stop_grace)
            self._failed(state, state.group.returncode if state.group else None, foreign)
        elif ok:
            state.status = "ready"
            self._record(state, f"job {state.name} is ready ({ready.describe()})", status="ready")
        elif state.ready_deadline is not None and now > state.ready_deadline:
            message = f"not ready after {ready.timeout:g}s ({ready.describe()})"
            self._stop_process(state, state.spec.stop_grace)
            self._failed(state, state.group.returncode if state.group else None, message)

    def _log_matches(self, state: JobState, pattern: str) -> bool:
        try:
            with open(state.log_path, "rb") as handle:
                handle.seek(state.log_offset)
                chunk = handle.read()
        except OSError:
            return False
        state.log_offset += len(chunk)
        text = state.log_buffer + chunk.decode(errors="replace")
        lines = text.split("\n")
        state.log_buffer = lines.pop()  # an unfinished line waits for its end
        regex = re.compile(pattern)
        return any(regex.search(line) for line in lines) or bool(regex.search(state.log_buffer))

    def _exited(self, state: JobState, code: int) -> None:
        state.exit_code = code
        state.ended_at = time.time()
        if state.stop_requested:
            return
        # Whatever the leader left behind in its group goes too (a dead job leaves no orphan).
        if state.group is not None:
            state.group.stop(grace=state.spec.stop_grace)
        if state.spec.kind == "task" and code == 0:
            state.status = "finished"
            self._record(state, f"job {state.name} finished", status="finished", exit_code=0,
                         ended_at=state.ended_at)
            return
        reason = exit_description(code)
        if state.spec.kind == "service":
            reason = f"service exited on its own ({reason})"
        self._failed(state, code, reason)

    def _failed(self, state: JobState, code: int | None, reason: str) -> None:
        tail = tail_text(state.log_path)
        state.status = "failed"
        state.exit_code = code
        state.ended_at = state.ended_at or time.time()
        state.message = reason + (f"\n--- last lines of {state.log_path.name} ---\n{tail}" if tail else "")
        policy = state.spec.restart
        retry = policy.allows(state.restarts)
        event = f"job {state.name} failed: {reason}"
        if retry:
            delay = policy.delay(state.restarts)
            state.restart_at = time.monotonic() + delay
            event += f"; restarting in {delay:g}s ({state.restarts + 1}/{policy.max_restarts})"
        self._record(state, event + (f"\n{tail}" if tail else ""), "error", status="failed", exit_code=code,
                     ended_at=state.ended_at, message=state.message)
        if retry:
            state.status = "restarting"
            self._record(state, None, status="restarting")

    # -- stop ------------------------------------------------------------------------------------
    def _stop_process(self, state: JobState, grace: float) -> str:
        state.stop_requested = True
        return state.group.stop(grace) if state.group is not None else "gone"

    def _mark_stopped(self, state: JobState, outcome: str, why: str) -> None:
        """Record a job that was live, pending or awaiting a restart as stopped."""
        was_live = state.status in ACTIVE
        state.restart_at = None
        state.status = "stopped"
        if was_live:
            state.ended_at = time.time()
            state.exit_code = state.group.returncode if state.group is not None else None
        state.message = f"{why} ({outcome})" if was_live else why
        self._record(state, f"job {state.name} stopped: {state.message}", status="stopped",
                     ended_at=state.ended_at, exit_code=state.exit_code, message=state.message)

    def _reap(self, state: JobState) -> None:
        """A job that ended on its own just before a stop keeps its own outcome (finished/failed)."""
        if state.group is not None and state.status in ACTIVE and not state.stop_requested:
            code = state.group.poll()
            if code is not None:
                self._exited(state, code)

    def stop(self, name: str, *, grace: float | None = None, why: str = "stopped by request") -> None:
        """SIGTERM the job's group, SIGKILL after the grace period; the job ends 'stopped'."""
        state = self.jobs[name]
        self._reap(state)
        grace = state.spec.stop_grace if grace is None else grace
        outcome = self._stop_process(state, grace) if state.status in ACTIVE else "gone"
        if state.status in ACTIVE or state.status in ("pending", "restarting"):
            self._mark_stopped(state, outcome, why)

    def stop_all(self, *, grace: float | None = None, why: str = "run stopped",
                 names: Iterable[str] | None = None) -> None:
        """Stop every live job at once (each with its own grace), then record them."""
        chosen = [self.jobs[n] for n in (names if names is not None else self.jobs)]
        for state in chosen:
            self._reap(state)
        live = [s for s in chosen if s.status in ACTIVE]
        outcomes: dict[str, str] = {}
        if live:
            with ThreadPoolExecutor(max_workers=len(live)) as pool:
                futures = {s.name: pool.submit(self._stop_process, s, s.spec.stop_grace if grace is None else grace)
                           for s in live}
                outcomes = {n: f.result() for n, f in futures.items()}
        for state in chosen:
            if state.status in ACTIVE or state.status in ("pending", "restarting"):
                self._mark_stopped(state, outcomes.get(state.name, "gone"),
                                   why if state.status != "pending" else f"not started ({why})")

    def restart(self, name: str, *, grace: float | None = None) -> JobState:
        """Stop the job if it runs, then start it again now (counts as a restart)."""
        state = self.jobs[name]
        if state.status in ACTIVE:
            self._stop_process(state, state.spec.stop_grace if grace is None else grace)
            self._mark_stopped(state, "terminated", "restart requested")
        if state.started_at is not None:
            state.restarts += 1
        return self.start(name)

    def wait(self, name: str, statuses: Iterable[str] = ("ready", "finished"), *, timeout: float | None = None,
             interval: float = 0.1) -> JobState:
        """Poll until the job reaches one of `statuses` or ends for good (then it is returned as is).

        For callers that drive one job at a time (e.g. serve, wait until ready, benchmark, stop).
        TimeoutError when `timeout` passes first.
        """
        wanted = set(statuses)
        state = self.jobs[name]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            if state.status in wanted or state.done_for_good:
                return state
            if (state.status == "running" and state.spec.kind == "service" and state.spec.ready is None
                    and "ready" in wanted):
                return state  # a service without readiness check: running is as ready as it gets
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {name} is still {state.status} after {timeout:g}s")
            time.sleep(interval)

    def states(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.jobs.values()]
