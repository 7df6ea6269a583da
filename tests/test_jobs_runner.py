"""Running recipes: the graph, outcomes, GPU leases, Ctrl-C with no orphans, detach/attach/stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from adaflash import procs
from adaflash.runlog import RunLog
from jobs.assign import AssignmentError, GpuLeases, LeaseError
from jobs.control import request_job_action, stop_run, supervisor_pid
from jobs.detached import start_detached
from jobs.plan import prepare
from jobs.recipe import RecipeError
from jobs.runner import Runner
from jobs.watch import run_view

from .test_jobs_supervisor import STUBBORN, wait_for

CLI = [sys.executable, "-m", "adaflash.cli.main"]


@pytest.fixture(autouse=True)
def _private_leases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def sleeping_service(tmp_path: Path, name: str) -> Path:
    """A recipe of one service that sleeps until it is stopped (1 s grace)."""
    return write(tmp_path, f"{name}.toml", f"""
        [run]
        name = "{name}"
        [jobs.svc]
        command = ["python", "-c", "import time; time.sleep(60)"]
        kind = "service"
        stop_grace = 1
    """)


def stubborn_recipe(tmp_path: Path, name: str, pids_file: Path, *, job: str = "worker", stop_grace: float = 1,
                    more: str = "") -> Path:
    """A recipe whose service `job` ignores SIGTERM and keeps a grandchild that ignores it too (both pids go to
    `pids_file`, `stop_grace` seconds before the SIGKILL); `more`: further [jobs.*] tables."""
    path = write(tmp_path, f"{name}.toml", f"""
        [run]
        name = "{name}"
        [jobs.{job}]
        command = ["python", "-c", {json.dumps(STUBBORN)}, "{pids_file}"]
        kind = "service"
        stop_grace = {stop_grace:g}
    """)
    path.write_text(path.read_text() + textwrap.dedent(more))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_graph_with_a_service_runs_to_the_end(tmp_path: Path) -> None:
    port = free_port()
    recipe = write(tmp_path, "ok.toml", f"""
        [run]
        name = "ok"
        [vars]
        greeting = "hello"
        [jobs.first]
        command = ["python", "-c", "print('{{vars.greeting}}')"]
        [jobs.server]
        command = ["python", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
        kind = "service"
        ready = {{ http = "http://127.0.0.1:{port}/", timeout = 20, interval = 0.1 }}
        after = ["first"]
        [jobs.client]
        command = ["python", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/').status)"]
        after = ["server"]
    """)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    result = Runner(prepared, log, tick=0.05).run()
    assert result.status == "finished" and result.exit_code == 0
    jobs = {j["name"]: j for j in log.jobs(prepared.run_id)}
    assert jobs["first"]["status"] == jobs["client"]["status"] == "finished"
    assert jobs["server"]["status"] == "stopped"  # services run until the end of the run
    assert (prepared.run_dir / "client.log").read_text().strip().endswith("200")
    assert "hello" in (prepared.run_dir / "first.log").read_text()
    run = log.get_run(prepared.run_id)
    assert run["kind"] == "recipe" and run["name"] == "ok" and run["status"] == "finished"
    assert run["config"]["jobs"]["first"]["command"][-1] == "print('hello')"  # the resolved recipe
    assert not run_view(log, prepared.run_id).live


def test_a_failed_task_fails_the_run_and_stops_the_rest(tmp_path: Path) -> None:
    recipe = write(tmp_path, "fail.toml", """
        [run]
        name = "fail"
        [jobs.slow]
        command = ["python", "-c", "import time; time.sleep(60)"]
        stop_grace = 1
        [jobs.broken]
        command = ["python", "-c", "import sys; print('boom'); sys.exit(4)"]
        [jobs.after_broken]
        command = ["python", "-c", "print('never')"]
        after = ["broken"]
    """)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    result = Runner(prepared, log, tick=0.05).run()
    assert result.status == "failed" and result.exit_code == 1 and result.failed == ["broken"]
    assert "job broken failed: exit code 4" in result.message
    jobs = {j["name"]: j for j in log.jobs(prepared.run_id)}
    assert jobs["broken"]["exit_code"] == 4 and "boom" in jobs["broken"]["message"]
    assert jobs["slow"]["status"] == "stopped" and not procs.is_ours(jobs["slow"]["pid"], jobs["slow"]["pid_start_time"])
    assert jobs["after_broken"]["status"] == "stopped" and jobs["after_broken"]["pid"] is None
    assert log.get_run(prepared.run_id)["status"] == "failed"


GPU_RECIPE = """
    [run]
    name = "gpu"
    [gpus]
    training = [0]
    [jobs.train]
    command = ["python", "-c", "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(60)"]
    role = "training"
    stop_grace = 1
"""


def test_two_runs_asking_for_the_same_gpu_the_second_is_refused(tmp_path: Path) -> None:
    recipe = write(tmp_path, "gpu.toml", GPU_RECIPE)
    leases = GpuLeases(tmp_path / "leases.json")
    fake_inventory = [0, 1]
    first = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(first.workspace)
    runner = Runner(first, log, leases=leases, inventory=fake_inventory, tick=0.05)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: (first.run_dir / "train.log").exists() and "0\n" in (first.run_dir / "train.log").read_text())
        second = prepare(recipe, workspace=tmp_path / "ws")
        with pytest.raises(LeaseError, match=rf"GPU 0 is in use by run {first.run_id}"):
            Runner(second, log, leases=leases, inventory=fake_inventory).start()
        # Refused before anything started: no run row, no run folder, no process.
        assert [r["id"] for r in log.list_runs()] == [first.run_id]
        assert not second.run_dir.exists()
        # Another GPU is free; an unknown one is refused by the inventory check.
        other = prepare(recipe, ["gpus.training=[5]"], workspace=tmp_path / "ws")
        with pytest.raises(AssignmentError, match=r"role 'training': GPU 5 does not exist \(known GPUs: 0, 1\)"):
            Runner(other, log, leases=leases, inventory=fake_inventory).start()
    finally:
        runner.request_stop()
        thread.join(30)
    assert log.get_run(first.run_id)["status"] == "stopped"
    assert leases.active() == []  # released at the end: the next run may take GPU 0
    again = prepare(recipe, workspace=tmp_path / "ws")
    runner2 = Runner(again, log, leases=leases, inventory=fake_inventory)
    runner2.start()
    runner2.request_stop()
    assert runner2.run().status == "stopped"


def test_control_requests_restart_and_stop_jobs(tmp_path: Path) -> None:
    recipe = sleeping_service(tmp_path, "svc")
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    runner = Runner(prepared, log, tick=0.05)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: runner.supervisor.jobs.get("svc") and runner.supervisor.jobs["svc"].status == "running")
        request_job_action(prepared.run_dir, "restart", "svc")
        wait_for(lambda: runner.supervisor.jobs["svc"].restarts == 1)
        request_job_action(prepared.run_dir, "stop", "svc")
        thread.join(30)  # the only job stopped: the run ends as stopped
    finally:
        runner.request_stop()
        thread.join(30)
    assert log.get_run(prepared.run_id)["status"] == "stopped"
    with pytest.raises(ValueError):
        request_job_action(prepared.run_dir, "explode", "svc")


def test_a_malformed_recipe_gives_file_key_line_and_starts_nothing(tmp_path: Path) -> None:
    recipe = write(tmp_path, "bad.toml", """\
        [run]
        name = "bad"
        [jobs.a]
        command = ["python", "-c", "open('started', 'w')"]
        restart = "sometimes"
    """)
    with pytest.raises(RecipeError):
        prepare(recipe, workspace=tmp_path / "ws")
    done = subprocess.run([*CLI, "--workspace", str(tmp_path / "ws"), "run", str(recipe)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert f"{recipe}:5: jobs.a.restart: expected one of never, on-failure, got 'sometimes'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "started").exists() and not (tmp_path / "ws").exists()


def test_sigint_to_adaflash_run_leaves_no_process_behind(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    recipe = stubborn_recipe(tmp_path, "stubborn", pids_file, more="""
        [jobs.sleeper]
        command = ["python", "-c", "import time; time.sleep(60)"]
        stop_grace = 1
    """)
    proc = subprocess.Popen([*CLI, "--workspace", str(tmp_path / "ws"), "run", str(recipe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        leader, grandchild = map(int, wait_for(lambda: pids_file.exists() and pids_file.read_text().split(),
                                               timeout=60))
        log = RunLog.open(tmp_path / "ws")
        run = log.list_runs()[0]
        sleeper = wait_for(lambda: next((j for j in log.jobs(run["id"]) if j["name"] == "sleeper" and j["pid"]), None))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    # Worker, its SIGTERM-ignoring grandchild and the other job are all gone.
    for pid in (leader, grandchild, sleeper["pid"]):
        wait_for(lambda pid=pid: procs.start_time(pid) is None, timeout=10)
    run = log.get_run(run["id"])
    assert run["status"] == "stopped" and "SIGINT" in (run["note"] or "")
    assert {j["status"] for j in log.jobs(run["id"])} == {"stopped"}
    assert "run " in out and "stopped" in out


def test_detach_attach_and_stop_through_the_cli(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    quick = write(tmp_path, "quick.toml", """
        [run]
        name = "quick"
        [jobs.hello]
        command = ["python", "-c", "import time; time.sleep(0.5); print('hello from the background')"]
    """)
    done = subprocess.run([*CLI, "--workspace", str(ws), "run", str(quick), "--detach", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout.strip().splitlines()[-1])["run_id"]
    attach = subprocess.run([*CLI, "--workspace", str(ws), "runs", "attach", run_id], capture_output=True,
                            text=True, timeout=60)
    assert attach.returncode == 0, attach.stderr
    assert "job hello finished" in attach.stdout and f"run {run_id} finished" in attach.stdout
    assert "hello from the background" in (ws / "runs" / run_id / "hello.log").read_text()

    long = sleeping_service(tmp_path, "long")
    done = subprocess.run([*CLI, "--workspace", str(ws), "run", str(long), "--detach", "--json"],
                          capture_output=True, text=True, timeout=60)
    run_id = json.loads(done.stdout.strip().splitlines()[-1])["run_id"]
    log = RunLog.open(ws)
    job = wait_for(lambda: next((j for j in log.jobs(run_id) if j["pid"]), None))
    supervisor = supervisor_pid(log.get_run(run_id))
    assert supervisor and supervisor != os.getpid()
    stop = subprocess.run([*CLI, "--workspace", str(ws), "runs", "stop", run_id], capture_output=True, text=True,
                          timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert f"run {run_id} stopped via supervisor" in stop.stdout
    assert log.get_run(run_id)["status"] == "stopped"
    wait_for(lambda: procs.start_time(job["pid"]) is None and procs.start_time(supervisor) is None, timeout=10)


# A job that keeps a run of its own, as `adaflash pipeline` does: SIGTERM is a stop request it honours.
OWN_RUN = (
    "import os, signal, sys, time\n"
    "from adaflash.runlog import RunLog\n"
    "log = RunLog.open()\n"
    "own = log.create_run('pipeline', name='own')\n"
    "def stop(*_):\n"
    "    log.finish_run(own, 'finished', note='stopped on request')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(120)\n"
)


def test_a_killed_supervisor_leaves_no_job_running_and_the_statuses_agree(tmp_path: Path) -> None:
    """kill -9 of a detached run's supervisor left its jobs running with parent 1, the job "failed" in the
    recipe run and "finished" in its own run."""
    pids_file, own_file = tmp_path / "pids", tmp_path / "own"
    recipe = stubborn_recipe(tmp_path, "orphan", pids_file, job="stubborn", more=f"""
        [jobs.own]
        command = ["python", "-c", {json.dumps(OWN_RUN)}, "{own_file}"]
        kind = "service"
    """)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    run_id = start_detached(prepared, log)
    leader, grandchild = map(int, wait_for(lambda: pids_file.exists() and pids_file.read_text().split(), timeout=60))
    own_pid = int(wait_for(lambda: own_file.exists() and own_file.read_text(), timeout=60))
    child = wait_for(lambda: next((r for r in log.list_runs() if r["name"] == "own"), None))
    os.kill(supervisor_pid(log.get_run(run_id)), signal.SIGKILL)
    for pid in (leader, grandchild, own_pid):  # the SIGTERM-ignoring pair too, after its grace
        wait_for(lambda pid=pid: procs.start_time(pid) is None, timeout=30)
    wait_for(lambda: "stopped its jobs" in (log.get_run(run_id)["note"] or ""), timeout=30)
    run = log.get_run(run_id)
    assert run["status"] == "failed" and "supervisor" in run["note"] and "died" in run["note"]
    jobs = {j["name"]: j for j in log.jobs(run_id)}
    assert {j["status"] for j in jobs.values()} == {"stopped"}
    assert "stopped by the run's watchdog (killed)" in jobs["stubborn"]["message"]
    assert log.get_run(child["id"])["status"] == "finished"  # the job honoured the stop, as recorded for it


def test_stop_when_the_supervisor_and_its_watchdog_are_gone_stops_the_verified_jobs(tmp_path: Path) -> None:
    import psutil

    pids_file = tmp_path / "pids"
    recipe = stubborn_recipe(tmp_path, "orphan", pids_file, job="svc")
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    run_id = start_detached(prepared, log)
    job = wait_for(lambda: next((j for j in log.jobs(run_id) if j["pid"] and j["status"] == "running"), None))
    # up to here the job may still be starting, and the SIGTERM its parent's death sends would end it
    wait_for(lambda: pids_file.exists() and pids_file.read_text())  # from here on it ignores SIGTERM
    supervisor = supervisor_pid(log.get_run(run_id))
    watchdog = next(p for p in psutil.Process(supervisor).children() if "jobs.watchdog" in p.cmdline())
    watchdog.kill()
    wait_for(lambda: procs.start_time(watchdog.pid) is None, timeout=10)  # a zombie of the supervisor counts as gone
    os.kill(supervisor, signal.SIGKILL)  # a job that ignores SIGTERM outlives both
    wait_for(lambda: supervisor_pid(log.get_run(run_id)) is None, timeout=10)
    view = run_view(log, run_id)
    assert view.orphaned and not view.live
    assert procs.is_ours(job["pid"], job["pid_start_time"])
    result = stop_run(log, run_id, grace=1)
    assert result.how == "direct" and result.stopped_jobs == ["svc"] and result.status == "stopped"
    wait_for(lambda: procs.start_time(job["pid"]) is None, timeout=10)
    assert log.get_job(job["id"])["status"] == "stopped"
    assert stop_run(log, run_id).how == "already ended"


def test_metrics_of_runs_created_by_the_jobs_show_in_the_view(tmp_path: Path) -> None:
    code = ("import os\nfrom adaflash.runlog import RunLog\nlog = RunLog.open()\n"
            "own = log.create_run('bench', name='matrix')\nlog.log_metrics(own, {'output_throughput': 42.0})\n"
            "log.log_metrics(os.environ['ADAFLASH_RUN_ID'], {'tau': 3.5})\n")
    recipe = write(tmp_path, "child.toml", f"""
        [run]
        name = "child"
        [jobs.bench]
        command = ["python", "-c", {json.dumps(code)}]
    """)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    assert Runner(prepared, log, tick=0.05).run().status == "finished"
    view = run_view(log, prepared.run_id)
    assert view.metrics == {"tau": 3.5, "bench:output_throughput": 42.0}
    assert [r["name"] for r in view.child_runs] == ["matrix"] and view.child_runs[0]["job"] == "bench"


def test_a_torchrun_job_runs_one_process_per_rank(tmp_path: Path) -> None:
    # one write per line: both ranks share the log, and print() may split a line across writes
    code = "import os; os.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\".encode())"
    recipe = write(tmp_path, "ddp.toml", f"""
        [run]
        name = "ddp"
        [jobs.train]
        command = ["python", "-c", {json.dumps(code)}]
        torchrun = {{ nproc = 2 }}
    """)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    argv = prepared.plan()[0].argv
    assert "--nproc_per_node" in argv and "--no-python" in argv and argv[argv.index("--no-python") + 1] == sys.executable
    log = RunLog.open(prepared.workspace)
    assert Runner(prepared, log, tick=0.05).run().status == "finished"
    text = (prepared.run_dir / "train.log").read_text()
    assert "rank 0 of 2" in text and "rank 1 of 2" in text


def test_a_second_sigint_does_not_wait_for_the_grace_period(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    recipe = stubborn_recipe(tmp_path, "slowstop", pids_file, stop_grace=120)
    proc = subprocess.Popen([*CLI, "--workspace", str(tmp_path / "ws"), "run", str(recipe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = list(map(int, wait_for(lambda: pids_file.exists() and pids_file.read_text().split(), timeout=60)))
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the first stop is under way (SIGTERM ignored, 120 s of grace ahead)
        proc.send_signal(signal.SIGINT)  # well inside the 120 s grace: forces SIGKILL now
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    for pid in pids:
        wait_for(lambda pid=pid: procs.start_time(pid) is None, timeout=10)


def test_the_hidden_supervisor_entry_only_takes_pending_runs(tmp_path: Path) -> None:
    from jobs.detached import supervise_existing

    log = RunLog.open(tmp_path / "ws")
    run_id = log.create_run("recipe", name="done", status="finished")
    with pytest.raises(RuntimeError, match="only a pending recipe run"):
        supervise_existing(tmp_path / "ws", run_id)
