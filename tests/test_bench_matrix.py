"""`adaflash bench matrix` end to end: real `adaflash serve` subprocesses on a tiny target, one after the other."""

from __future__ import annotations

import json
import sys
import time

import pytest
from click.testing import CliRunner

from adaflash.bench.matrix import ServerProcess


def test_matrix_serves_each_method_and_leaves_a_comparison(workspace, tiny_llama, tiny_target, tmp_path):
    from adaflash.cli.main import cli
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.runlog import RunLog

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg), tmp_path / "draft")
    (workspace / "data").mkdir(parents=True)
    rows = [{"id": f"q{i}", "conversations": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "reference": str(2 * i)} for i in range(3)]
    (workspace / "data" / "gsm8k_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(cli, [
        "bench", "matrix", "--methods", "vanilla,dflash", "--datasets", "gsm8k", "--concurrency", "1,2",
        "--target", str(tiny_llama), "--draft", f"dflash={draft}", "--num-prompts", "3", "--max-new-tokens", "5",
        "--warmup", "0", "--context-length", "128", "--eval-accuracy", "--format", "json", "--ready-timeout", "180",
    ])
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.stdout)
    cells = {(r["method"], r["concurrency"]): r for r in comparison["rows"]}
    assert set(cells) == {("vanilla", 1), ("vanilla", 2), ("dflash", 1), ("dflash", 2)}
    assert all(r["n"] == 3 for r in cells.values())
    assert cells[("vanilla", 2)]["speedup"] == 1.0 and cells[("dflash", 1)]["speedup"] > 0

    log = RunLog.open(workspace)
    matrix = log.list_runs(kind="bench-matrix")[0]
    assert matrix["status"] == "finished" and matrix["note"].startswith("4/4")
    assert comparison["source"] == matrix["id"]
    children = log.list_runs(kind="bench")
    assert len(children) == 4 and all(c["config"]["matrix_run"] == matrix["id"] for c in children)
    served = log.list_runs(kind="serve")
    assert {s["method"] for s in served} == {"vanilla", "dflash"}
    assert all(s["status"] == "finished" for s in served), [  # SIGTERM handled: the run closed cleanly
        (s["method"], s["status"], s["note"], log.events_since(0, run_id=s["id"])[-3:]) for s in served] + [
        e["message"] for e in log.events_since(0, run_id=matrix["id"]) if "server stopped" in e["message"]]
    assert (workspace / "runs" / matrix["id"] / "serve-dflash.log").read_text().count("adaflash server ready on") == 1
    jobs = log.jobs(matrix["id"])  # started through jobs.supervisor: one row per server
    assert [j["name"] for j in jobs] == ["serve-vanilla", "serve-dflash"] and {j["status"] for j in jobs} == {"stopped"}
    again = CliRunner().invoke(cli, ["runs", "compare"])
    assert again.exit_code == 0 and "dflash" in again.stdout


def test_server_process_escalates_to_sigkill(tmp_path):
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = ServerProcess([sys.executable, "-c", script], tmp_path / "p.log")
    proc.start()
    deadline = time.monotonic() + 20
    while "up" not in (tmp_path / "p.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.stop(grace=0.5) == -9
    dead = ServerProcess([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "d.log")
    dead.start()
    try:
        dead.wait_ready("http://127.0.0.1:9", timeout=20)
    except RuntimeError as err:
        assert "exited (code 3)" in str(err)
    else:
        raise AssertionError("wait_ready should fail for a dead server")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_matrix_leaves_no_server_behind(tmp_path):
    """The server of a matrix killed outright gets SIGTERM from the kernel, as every child of `procs.spawn`."""
    import os
    import signal
    import subprocess

    from adaflash.procs import start_time
    from tests.test_jobs_supervisor import wait_for

    server = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    matrix = ("import sys, time\nfrom adaflash.bench.matrix import ServerProcess\n"
              "ServerProcess([sys.executable, '-c', sys.argv[1], sys.argv[2]], sys.argv[3]).start()\ntime.sleep(60)\n")
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-c", matrix, server, str(pid_file), str(tmp_path / "s.log")])
    try:
        pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for(lambda: start_time(pid) is None, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_suite_in_a_matrix_is_measured_per_domain_with_an_overall_row(workspace, tiny_llama, tiny_target, tmp_path):
    """Each domain of a suite is a dataset of its own in the matrix; the overall row's speed-up is the mean
    of the domains' speed-ups."""
    from statistics import fmean

    from adaflash.cli.main import cli
    from adaflash.models.drafter_io import new_drafter, save_drafter

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg), tmp_path / "draft")
    (workspace / "data").mkdir(parents=True)
    rows = [{"id": f"{d}{i}", "domain": d, "conversations": [{"role": "user", "content": f"{d} {i}?"}]}
            for d in ("math", "chat") for i in range(2)]
    (workspace / "data" / "mini_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(cli, [
        "bench", "matrix", "--methods", "vanilla,dflash", "--datasets", "mini", "--concurrency", "2",
        "--target", str(tiny_llama), "--draft", f"dflash={draft}", "--num-prompts", "2", "--max-new-tokens", "4",
        "--warmup", "0", "--context-length", "128", "--format", "json", "--ready-timeout", "180",
    ])
    assert result.exit_code == 0, result.output
    table = {(r["method"], r["dataset"]): r for r in json.loads(result.stdout)["rows"]}
    assert set(table) == {(m, d) for m in ("vanilla", "dflash") for d in ("mini", "mini/math", "mini/chat")}
    assert all(table[(m, f"mini/{d}")]["n"] == 2 for m in ("vanilla", "dflash") for d in ("math", "chat"))
    mean = fmean(table[("dflash", f"mini/{d}")]["speedup"] for d in ("math", "chat"))
    assert table[("dflash", "mini")]["speedup"] == pytest.approx(mean)
    assert table[("vanilla", "mini")]["speedup"] == pytest.approx(1.0)
