"""The one way processes are started and stopped (`adaflash.procs`): its guarantees, as every place that
starts a child (the recipe supervisor, the pipeline launcher, the benchmark matrix, `serve --engine
sglang`) relies on them. Real short processes; each place's own use is tested beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaflash import procs
from tests.test_jobs_supervisor import wait_for

PY = sys.executable
LINUX = sys.platform.startswith("linux")
# Ignores SIGTERM (a mark says it came), so only SIGKILL ends it.
DEAF = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write('term'))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n")


def started(group: procs.ProcessGroup, log: Path) -> None:
    wait_for(lambda: log.exists() and "up" in log.read_text())


def test_a_child_leads_its_own_group_and_session(tmp_path: Path) -> None:
    group = procs.spawn([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], log=tmp_path / "c.log")
    try:
        started(group, tmp_path / "c.log")
        assert os.getpgid(group.pid) == group.pgid == group.pid and os.getsid(group.pid) == group.pid
        assert procs.is_ours(group.pid, group.pid_start_time)
    finally:
        assert group.stop(grace=5) == "terminated"
    assert group.ended_as() == "stopped"  # it died of the SIGTERM we sent it


def test_stop_sends_term_then_kill_after_the_grace(tmp_path: Path) -> None:
    log, mark = tmp_path / "d.log", tmp_path / "mark"
    group = procs.spawn([PY, "-c", DEAF, str(mark)], log=log)
    started(group, log)
    begun = time.monotonic()
    assert group.stop(grace=0.5) == "killed"
    assert time.monotonic() - begun >= 0.5 and mark.read_text() == "term"
    assert group.returncode == -signal.SIGKILL and group.killed and group.ended_as() == "stopped"
    assert procs.start_time(group.pid) is None


def test_stop_reaches_a_descendant_that_left_the_group(tmp_path: Path) -> None:
    """A grandchild in a session of its own is out of reach of the group's signal, not of `stop`."""
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            "open(sys.argv[1], 'w').write(str(child.pid))\n"
            "time.sleep(60)\n")
    pid_file = tmp_path / "pid"
    group = procs.spawn([PY, "-c", code, str(pid_file)])
    grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text()))
    assert os.getpgid(grandchild) != group.pgid
    group.stop(grace=5)
    wait_for(lambda: procs.start_time(grandchild) is None, timeout=10)


def test_a_stop_asked_another_way_gets_the_grace_then_a_kill(tmp_path: Path) -> None:
    """`ask_stop(None)`: the child was asked through a file it watches; the grace counts from the ask."""
    log, mark = tmp_path / "d.log", tmp_path / "mark"
    group = procs.spawn([PY, "-c", DEAF, str(mark)], log=log)
    started(group, log)
    assert not group.kill_if_overdue(0.0)  # nothing asked yet
    group.ask_stop(None)
    assert not group.kill_if_overdue(30.0) and group.alive()
    time.sleep(0.3)
    assert group.kill_if_overdue(0.2)
    group.wait(timeout=10)
    assert group.ended_as() == "stopped" and not mark.exists()  # no SIGTERM was sent


def test_a_forwarded_signal_and_how_the_child_ended(tmp_path: Path) -> None:
    """The statuses every place records: exit 0 finished, a signal we sent stopped (or finished when the
    caller counts it as a clean end), any other exit failed."""
    # Python keeps SIGINT ignored when it starts ignored (a background job's children): take it back
    child = ("import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "print('up', flush=True); time.sleep(60)")
    group = procs.spawn([PY, "-c", child], log=tmp_path / "s.log")
    started(group, tmp_path / "s.log")
    assert group.ended_as() is None
    group.ask_stop(signal.SIGINT)
    group.wait(timeout=30)
    assert group.ended_as() == "stopped" and group.ended_as(clean=(0, -signal.SIGINT)) == "finished"
    for code, status in ((0, "finished"), (3, "failed")):
        done = procs.spawn([PY, "-c", f"raise SystemExit({code})"])
        done.wait(timeout=10)
        assert done.ended_as() == status
    crashed = procs.spawn([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    crashed.wait(timeout=10)
    assert crashed.ended_as() == "failed"  # a signal we did not send


@pytest.mark.skipif(not LINUX, reason="the parent-death signal is Linux's")
def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path: Path) -> None:
    child = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], 'w').write('term'), sys.exit(0)))\n"
             "open(sys.argv[1] + '.pid', 'w').write(str(os.getpid()))\n"
             "time.sleep(60)\n")
    parent = ("import sys, time\nfrom adaflash.procs import spawn\n"
              "spawn([sys.executable, '-c', sys.argv[1], sys.argv[2]])\ntime.sleep(60)\n")
    mark = tmp_path / "mark"
    proc = subprocess.Popen([PY, "-c", parent, child, str(mark)])
    try:
        pid = int(wait_for(lambda: Path(f"{mark}.pid").exists() and Path(f"{mark}.pid").read_text(), timeout=30))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for(lambda: procs.start_time(pid) is None, timeout=20)
        assert mark.read_text() == "term"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(not LINUX, reason="the parent-death signal is Linux's")
def test_a_child_meant_to_outlive_us_does(tmp_path: Path) -> None:
    """`die_with_parent=False` (a detached supervisor) survives its parent's death."""
    parent = ("import sys\nfrom adaflash.procs import spawn\n"
              "g = spawn([sys.executable, '-c', 'import time; time.sleep(60)'], log=sys.argv[1], die_with_parent=False)\n"
              "print(g.pid, g.pid_start_time, flush=True)\n")
    out = subprocess.run([PY, "-c", parent, str(tmp_path / "c.log")], capture_output=True, text=True, check=True,
                         timeout=60)
    pid, start = out.stdout.split()
    try:
        time.sleep(0.3)
        assert procs.is_ours(int(pid), float(start))
    finally:
        assert procs.stop_tree(int(pid), int(pid), float(start), grace=5) in ("terminated", "killed")


def test_spawn_keeps_stdout_apart_from_the_log_when_asked(tmp_path: Path) -> None:
    """A --json summary on stdout must not mix with what the child says on stderr (data regenerate --procs)."""
    log, summary = tmp_path / "child.log", tmp_path / "summary.json"
    with log.open("wb") as err, summary.open("wb") as out:
        group = procs.spawn([PY, "-c", "import sys; print('{}'); print('noise', file=sys.stderr)"], log=err, stdout=out)
    assert group.wait(timeout=30) == 0
    assert summary.read_text().strip() == "{}" and log.read_text().strip() == "noise"


def test_signal_pid_says_whether_the_process_was_there() -> None:
    group = procs.spawn([PY, "-c", "import time; time.sleep(60)"])
    assert procs.is_ours(group.pid, group.pid_start_time)
    assert procs.signal_pid(group.pid, signal.SIGTERM)
    group.wait(timeout=30)
    assert not procs.signal_pid(group.pid, signal.SIGTERM)
