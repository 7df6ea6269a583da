"""Start, watch and stop child process groups, the one way the project does it.

Every child started with `spawn` gets the same guarantees, whoever starts it (the recipe
supervisor, the pipeline launcher, the benchmark matrix, `serve --engine sglang`):
- its own session and process group, so one signal reaches its children, and a Ctrl-C in the
  terminal reaches only the parent, which then stops it in order;
- on Linux, SIGTERM when its parent dies (even by SIGKILL), so nothing is left orphaned;
- its pid recorded with its create time: pids are recycled, and before any signal we check that
  the live process with that pid was created at that time (a zombie counts as gone);
- a stop is SIGTERM to the whole group plus any descendant that left it, SIGKILL to what is left
  after a grace period; the exit status is kept (`ProcessGroup.returncode`). A stop asked another
  way (a forwarded Ctrl-C, a STOP file the child watches) gets the same grace (`ask_stop`,
  `kill_if_overdue`);
- one status for how it ended (`ProcessGroup.ended_as`): killed by us once a stop's grace ran out
  reads "stopped" wherever it was started, never "failed".

Torch-free, so `jobs` (which the core may not import) uses it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from adaflash.runlog import START_TIME_TOLERANCE, process_start_time

# psutil derives create times from boot time + clock ticks: identical across readers (the run log's
# tolerance only absorbs float rounding); one reading of a pid's create time for the whole project.
start_time = process_start_time


def is_ours(pid: int | None, recorded_start: float | None) -> bool:
    """True when `pid` is alive and is the very process recorded (same create time)."""
    if not pid or pid <= 0:
        return False
    actual = start_time(pid)
    if actual is None:
        return False
    if recorded_start is None:
        return False
    return abs(actual - float(recorded_start)) <= START_TIME_TOLERANCE


def group_members(pgid: int, not_before: float | None = None) -> list[psutil.Process]:
    """Live processes whose process group is `pgid` (created at or after `not_before`)."""
    members = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) != pgid:
                continue
            if not_before is not None and proc.info["create_time"] + START_TIME_TOLERANCE < not_before:
                continue
            members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def descendants(pid: int) -> list[psutil.Process]:
    """Every descendant of a live process (empty when it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def _signal_all(pgid: int | None, procs: Iterable[psutil.Process], sig: int) -> None:
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def stop_tree(
    pid: int | None,
    pgid: int | None,
    recorded_start: float | None,
    *,
    grace: float = 10.0,
    poll: float = 0.05,
    reap: Callable[[], object] | None = None,
) -> str:
    """Stop a verified job: SIGTERM its group and descendants, SIGKILL what is left after `grace`.

    Nothing is signalled unless the leader is verified (pid + create time), or, when the leader
    is already gone, the group still has members born no earlier than the leader was. `reap`
    (e.g. Popen.poll) is called while waiting so our own child does not linger as a zombie.
    Returns "terminated", "killed", or "gone" (nothing of ours was left to signal).
    """
    targets: list[psutil.Process] = []
    leader_ours = is_ours(pid, recorded_start)
    if leader_ours:
        targets.append(psutil.Process(pid))
        targets.extend(descendants(pid))
    group_ok = False
    # A group whose leader pid now belongs to another process was recycled: never touch it.
    recycled = bool(pgid and pgid == pid and not leader_ours and start_time(pgid) is not None)
    if pgid and not recycled:
        members = group_members(pgid, not_before=recorded_start)
        group_ok = bool(members) or leader_ours
        known = {p.pid for p in targets}
        targets.extend(m for m in members if m.pid not in known)
    if not targets:
        if reap:
            reap()
        return "gone"
    group = pgid if group_ok else None
    _signal_all(group, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap:
            reap()
        # Late-born children (forked while terminating) join the list too.
        if pid and is_ours(pid, recorded_start):
            known = {p.pid for p in targets}
            targets.extend(p for p in descendants(pid) if p.pid not in known)
        if not _alive(targets):
            return "terminated"
        time.sleep(poll)
    left = _alive(targets)
    _signal_all(group, left, signal.SIGKILL)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        if reap:
            reap()
        if not _alive(left):
            break
        time.sleep(poll)
    return "killed"


def signal_pid(pid: int, sig: int) -> bool:
    """Send `sig` to one process whose identity the caller has just verified (`is_ours`); whether it was
    still there. The one place outside `ProcessGroup` where a pid is signalled, so a stray `os.kill` on a
    recycled pid stands out in review (ruff bans it elsewhere)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def ancestors(pid: int) -> list[int]:
    """pid and its ancestors' pids, nearest first (empty when the process is gone)."""
    try:
        proc = psutil.Process(pid)
        return [proc.pid] + [p.pid for p in proc.parents()]
    except psutil.Error:
        return []


PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec function that has Linux send the child `sig` when its parent dies (None elsewhere).

    Resolved here, in the parent: the child only makes the call. A parent that died between the fork
    and the call would never signal, so the child checks it still has the parent that forked it.
    Linux ties the signal to the *thread* that forked: start children from a thread that outlives them.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return die_with_parent


@dataclass
class ProcessGroup:
    """A child leading its own process group, with the identity (pid + create time) every stop checks."""

    proc: subprocess.Popen
    started_at: float  # wall clock
    pid_start_time: float
    stop_asked_at: float | None = None  # monotonic: the first stop request, from which the grace counts
    signalled: set[int] = field(default_factory=set)  # the signals we sent it while it ran

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # a new session: the child leads its group

    @property
    def killed(self) -> bool:
        """SIGKILLed by us while it ran (a stop's grace ran out, a forced stop)."""
        return signal.SIGKILL in self.signalled

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def send(self, sig: int) -> None:
        """Signal the whole group (nothing when the leader has been reaped: its pgid may be reused)."""
        if self.proc.poll() is None:
            self.signalled.add(sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)

    def ask_stop(self, sig: int | None = signal.SIGTERM) -> None:
        """Ask the group to stop: `sig` to the whole group, or None when it was asked another way (a STOP
        file it watches). The grace of `kill_if_overdue` counts from the first ask."""
        if self.stop_asked_at is None:
            self.stop_asked_at = time.monotonic()
        if sig is not None:
            self.send(sig)

    def kill_if_overdue(self, grace: float) -> bool:
        """SIGKILL the group if it is still up `grace` seconds after a stop was first asked; whether it was."""
        if self.stop_asked_at is None or time.monotonic() - self.stop_asked_at <= grace or not self.alive():
            return False
        self.kill()
        return True

    def stop(self, grace: float = 10.0) -> str:
        """SIGTERM the group and descendants, SIGKILL what is left after `grace`; the leader reaped.
        Returns "terminated", "killed" or "gone" (see `stop_tree`); the exit status is in `returncode`.
        Also what a leader that exited left behind in its group (a torchrun rank) goes this way."""
        running = self.alive()
        if running:
            self.ask_stop(None)
        outcome = stop_tree(self.pid, self.pgid, self.pid_start_time, grace=grace, reap=self.proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if running:
            self.signalled.update((signal.SIGTERM, signal.SIGKILL) if outcome == "killed" else (signal.SIGTERM,))
        return outcome

    def kill(self) -> None:
        """SIGKILL the group now (the second Ctrl-C, a failed sibling, a stop's grace run out)."""
        self.send(signal.SIGKILL)

    def ended_as(self, clean: Iterable[int] = (0,)) -> str | None:
        """The run log's status for how the leader ended (None while it runs): "finished" on an exit code in
        `clean` (a server that dies of the stop signal it was sent ended as asked), "stopped" when it died of
        a signal we sent it (a stop, a kill after the grace), else "failed"."""
        code = self.proc.poll()
        if code is None:
            return None
        if code in tuple(clean):
            return "finished"
        return "stopped" if code < 0 and -code in self.signalled else "failed"


def spawn(
    argv: list[str],
    *,
    log: str | os.PathLike | IO[bytes] | None = None,
    stdout: IO[Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: Any = subprocess.DEVNULL,
    die_with_parent: bool = True,
) -> ProcessGroup:
    """Start `argv` in a new session, its stdout and stderr appended to `log` (a path or an open binary
    file; None: inherited); with `stdout` (an open file: a --json summary kept apart) `log` gets stderr
    alone. `die_with_parent=False` only for a process meant to outlive us (a detached supervisor).
    OSError when the program cannot be started."""
    def popen(out: Any) -> subprocess.Popen:
        if stdout is not None:
            streams = {"stdout": stdout, "stderr": out}
        else:
            streams = {"stdout": out, "stderr": subprocess.STDOUT if out is not None else None}
        return subprocess.Popen(
            argv, **streams, stdin=stdin,
            env=None if env is None else dict(env), cwd=cwd or None, start_new_session=True, close_fds=True,
            preexec_fn=parent_death_signal() if die_with_parent else None,
        )

    if isinstance(log, (str, os.PathLike)):
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = popen(out)
    else:
        proc = popen(log)
    started = time.time()
    return ProcessGroup(proc, started, start_time(proc.pid) or started)  # exited already: an identity anyway
