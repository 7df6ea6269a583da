"""Process identity and group signalling that never hits a stranger.

Why: pids are recycled. Every pid the control plane records comes with the process's create
time; before any signal we check that the live process with that pid was created at that time
(a zombie counts as gone). Stopping a job means its whole process group plus any descendant
that left the group, SIGTERM first and SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable

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


def ancestors(pid: int) -> list[int]:
    """pid and its ancestors' pids, nearest first (empty when the process is gone)."""
    try:
        proc = psutil.Process(pid)
        return [proc.pid] + [p.pid for p in proc.parents()]
    except psutil.Error:
        return []
