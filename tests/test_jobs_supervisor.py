"""Supervision with real short processes: readiness, restarts, kill -9, group stop, stale pids."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adaflash import procs
from adaflash.runlog import RunLog
from jobs.recipe_spec import JobSpec, ReadyCheck, RestartPolicy
from jobs.supervisor import Supervisor

PY = sys.executable
# A worker that starts a grandchild; both ignore SIGTERM (only SIGKILL ends them); pids go to a file.
STUBBORN = (
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}')\n"
    "print('worker up', flush=True)\n"
    "time.sleep(60)\n"
)


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, step: float = 0.05) -> object:
    """Poll until `predicate` is truthy; a generous bound, never a timing assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def sup(tmp_path: Path):
    log = RunLog.open(tmp_path / "ws")
    run_id = log.create_run("recipe", name="test")
    supervisor = Supervisor(log, run_id, tmp_path / "ws" / "runs" / run_id, workspace=tmp_path / "ws")
    yield supervisor
    supervisor.stop_all(grace=0.5)


def spec(name: str, code: str, *args: str, **kw) -> JobSpec:
    return JobSpec(name=name, command=["python", "-c", code, *args], **kw)


def test_task_success_failure_exit_code_and_log_tail(sup: Supervisor) -> None:
    ok = sup.add(spec("ok", "import os; print('visible=' + repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['ADAFLASH_JOB'])"))
    bad = sup.add(spec("bad", "import sys\nfor i in range(30): print('line', i)\nsys.exit(3)"))
    sup.start("ok")
    sup.start("bad")
    wait_for(lambda: (sup.poll(), ok.status == "finished" and bad.status == "failed")[1])
    assert ok.exit_code == 0 and "visible='' ok" in ok.log_path.read_text()  # CPU job: GPUs hidden
    assert bad.exit_code == 3
    row = sup.runlog.get_job(bad.job_id)
    assert row["status"] == "failed" and row["exit_code"] == 3 and row["pid"] and row["pid_start_time"]
    assert "exit code 3" in row["message"] and "line 29" in row["message"] and "line 5\n" not in row["message"]
    assert row["log_path"] == str(bad.log_path) and row["ended_at"] >= row["started_at"]
    events = [e["message"] for e in sup.runlog.events_since(0, run_id=sup.run_id)]
    assert any(m.startswith("job bad failed: exit code 3") and "line 29" in m for m in events)


def test_readiness_by_http_and_by_log_line_and_timeout(sup: Supervisor) -> None:
    port = free_port()
    http = sup.add(JobSpec(name="http", command=["python", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           kind="service", ready=ReadyCheck(http=f"http://127.0.0.1:{port}/", timeout=20, interval=0.1)))
    logged = sup.add(spec("logged", "import time; time.sleep(0.3); print('server listening on 1234', flush=True); "
                                    "time.sleep(60)", kind="service",
                          ready=ReadyCheck(log=r"listening on \d+", timeout=20, interval=0.1)))
    never = sup.add(spec("never", "import time; time.sleep(60)", kind="service",
                         ready=ReadyCheck(log="never printed", timeout=0.5, interval=0.1), stop_grace=0.5))
    for name in ("http", "logged", "never"):
        sup.start(name)
    assert http.status == "starting" and not http.satisfied
    wait_for(lambda: (sup.poll(), http.status == "ready" and logged.status == "ready" and never.status == "failed")[1])
    assert http.satisfied and logged.satisfied
    assert "not ready after 0.5s" in never.message and not procs.is_ours(never.pid, never.pid_start_time)


def test_kill_9_worker_is_marked_failed_restarted_per_policy_and_log_intact(sup: Supervisor, tmp_path: Path) -> None:
    worker = sup.add(spec("worker", "import time; print('worker up', flush=True); time.sleep(60)", kind="service",
                          restart=RestartPolicy(mode="on-failure", max_restarts=1, backoff=0.1)))
    sup.start("worker")
    first_pid = worker.pid
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: (sup.poll(), worker.restarts == 1 and worker.status == "running")[1])
    assert worker.pid != first_pid and procs.is_ours(worker.pid, worker.pid_start_time)
    events = [e["message"] for e in sup.runlog.events_since(0, run_id=sup.run_id)]
    assert any("job worker failed: service exited on its own (killed by SIGKILL); restarting in 0.1s (1/1)" in m
               for m in events)
    assert any(m.startswith("restarting job worker (1/1)") for m in events)
    # The second kill exhausts the policy: failed for good, exit code and log tail kept.
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: (sup.poll(), worker.status == "failed" and worker.restart_at is None)[1])
    row = sup.runlog.get_job(worker.job_id)
    assert row["status"] == "failed" and row["exit_code"] == -9 and row["restarts"] == 1
    assert "killed by SIGKILL" in row["message"] and "worker up" in row["message"]
    text = worker.log_path.read_text()  # both starts appended to one log (a worker killed early printed nothing)
    assert text.count("=== adaflash: start ") == 2 and "start 1 of job worker" in text and "start 2 of job worker" in text
    assert sup.runlog.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_stop_ends_the_whole_group_grandchildren_included(sup: Supervisor, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    job = sup.add(spec("stubborn", STUBBORN, str(pids_file), kind="service", stop_grace=0.5))
    sup.start("stubborn")
    leader, grandchild = map(int, wait_for(lambda: pids_file.exists() and pids_file.read_text().split()))
    assert os.getpgid(grandchild) == job.pgid  # the grandchild is in the job's own group
    sup.stop("stubborn")
    assert job.status == "stopped" and "killed" in job.message  # SIGTERM ignored -> SIGKILL after grace
    wait_for(lambda: procs.start_time(leader) is None and procs.start_time(grandchild) is None, timeout=10)
    assert sup.runlog.get_job(job.job_id)["status"] == "stopped"


def test_a_stale_pid_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        real_start = wait_for(lambda: procs.start_time(bystander.pid))
        assert procs.is_ours(bystander.pid, real_start)
        # Recorded with another create time: a recycled pid that is not ours any more.
        assert not procs.is_ours(bystander.pid, real_start - 100)
        assert procs.stop_tree(bystander.pid, bystander.pid, real_start - 100, grace=0.2) == "gone"
        time.sleep(0.2)
        assert bystander.poll() is None  # untouched
        assert not procs.is_ours(None, real_start) and not procs.is_ours(bystander.pid, None)
    finally:
        bystander.kill()
        bystander.wait()


def test_restart_and_stop_on_request(sup: Supervisor) -> None:
    job = sup.add(spec("svc", "import time; time.sleep(60)", kind="service", stop_grace=2))
    sup.start("svc")
    first = job.pid
    sup.restart("svc")
    assert job.restarts == 1 and job.pid != first and job.status == "running"
    assert procs.start_time(first) is None or not procs.is_ours(first, None)
    sup.stop("svc")
    assert job.status == "stopped" and job.exit_code == -signal.SIGTERM
    pending = sup.add(spec("later", "pass"))
    sup.stop_all()
    assert pending.status == "stopped" and pending.message.startswith("not started")


def test_a_command_that_cannot_start_fails_cleanly(sup: Supervisor) -> None:
    job = sup.add(JobSpec(name="missing", command=["/nonexistent/adaflash-tool", "--x"]))
    sup.start("missing")
    assert job.status == "failed" and "could not start" in job.message
    assert sup.runlog.get_job(job.job_id)["status"] == "failed"


def test_wait_drives_one_job_at_a_time(sup: Supervisor) -> None:
    sup.add(spec("svc", "import time; print('up', flush=True); time.sleep(60)", kind="service",
                 ready=ReadyCheck(log="^up$", timeout=20, interval=0.05)))
    sup.start("svc")
    assert sup.wait("svc", timeout=20).status == "ready"
    sup.add(spec("task", "pass"))
    sup.start("task")
    assert sup.wait("task", timeout=20).status == "finished"
    sup.add(spec("slow", "import time; time.sleep(60)", kind="service", ready=ReadyCheck(log="never", timeout=60)))
    sup.start("slow")
    with pytest.raises(TimeoutError, match="job slow is still starting"):
        sup.wait("slow", timeout=0.3)


def test_a_job_that_ended_just_before_a_stop_keeps_its_outcome(sup: Supervisor) -> None:
    done = sup.add(spec("done", "pass"))
    sup.start("done")
    wait_for(lambda: done.group.poll() is not None)  # exited, not yet seen by a poll
    sup.stop_all()
    assert done.status == "finished" and done.exit_code == 0
