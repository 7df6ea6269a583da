"""The progress display of `adaflash run`: which step of how many, the step's own progress (from the run
log or from its log file), elapsed time, in a plain log (no terminal) as CI or `| tee` sees it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from jobs.progress import StepProgress, format_seconds, last_log_line

CLI = [sys.executable, "-m", "adaflash.cli.main"]

# A job that records training-like metrics in a run of its own (as `adaflash train` does), then waits.
TRAIN = textwrap.dedent("""
    import os, sys, time
    from adaflash.runlog import RunLog
    log = RunLog.open()
    run = log.create_run('train', name='toy')
    for step in (1, 2, 3):
        log.log_metrics(run, {'loss': 2.0 / step, 'lr': 0.1}, step=step)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    log.finish_run(run)
""")
# A job that only draws a progress bar on one line (carriage returns, colours), then waits.
FETCH = textwrap.dedent("""
    import os, sys, time
    for i in range(3):
        print(f"\\r\\x1b[2K\\x1b[1mfetching\\x1b[0m {i}/5", end="", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    print("\\rfetching 5/5 done")
""")


def read_until(proc: subprocess.Popen, needle: str, seen: list[str], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} never printed; got:\n{''.join(seen)}")


def test_a_plain_log_shows_step_of_total_the_jobs_own_progress_and_time(tmp_path: Path) -> None:
    go_train, go_fetch = tmp_path / "go-train", tmp_path / "go-fetch"
    recipe = tmp_path / "toy.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "toy"
        [vars]
        steps = 10
        [jobs.train]
        description = "a toy training"
        command = ["python", "-c", {json.dumps(TRAIN)}, "{go_train}"]
        progress = {{ total = "{{vars.steps}}", metric = "loss" }}
        [jobs.fetch]
        command = ["python", "-c", {json.dumps(FETCH)}, "{go_fetch}"]
        after = ["train"]
    """))
    proc = subprocess.Popen([*CLI, "--workspace", str(tmp_path / "ws"), "run", str(recipe), "--progress-every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        line = read_until(proc, "step 1/2 train: 3/10 (30%) · loss 0.6667", seen)
        assert " · run 0:" in line and line.startswith("[")
        go_train.write_text("")
        line = read_until(proc, "step 2/2 fetch: fetching 2/5", seen)  # the bar's last state, escapes dropped
        assert "\x1b" not in line and "\r" not in line
        go_fetch.write_text("")
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 0, out
    assert "2/2 steps done in" in out and "✓ finished" in out


def test_last_log_line_is_what_a_terminal_shows(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("=== adaflash: start 1 of job x\nloading\n\x1b[?25l\r\x1b[2Ktrain ━━ 1/60\r\x1b[2Ktrain ━━ 2/60 \x1b[0m\n"
                   "=== adaflash: job x stopped\n\n")
    assert last_log_line(log) == "train ━━ 2/60"
    assert last_log_line(tmp_path / "missing.log") is None


def test_estimates_come_from_the_jobs_own_progress_else_from_the_last_run() -> None:
    now = time.time()
    step = StepProgress(index=3, name="train", status="running", started_at=now - 60, done=15, total=60,
                        metric="loss", value=2.5, previous=300)
    assert step.detail() == "15/60 (25%) · loss 2.5"
    assert step.remaining is not None and 175 < step.remaining < 185  # 60 s for a quarter: 3 minutes left
    assert step.timing().startswith("1:0") and "left" in step.timing()
    step.rate = 0.5  # measured between its first and newest report: the start-up does not count
    assert step.remaining == 90 and step.timing().endswith("~1:30 left")
    step = StepProgress(index=2, name="regenerate", status="running", started_at=now - 60, previous=300,
                        log_line="loading the target")
    assert step.detail() == "loading the target" and "(last run 5:00)" in step.timing()
    assert StepProgress(index=1, name="prepare", status="cached").timing() == "reused"
    assert format_seconds(3725) == "1:02:05" and format_seconds(65) == "1:05"


def test_progress_from_the_runs_a_job_records(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from adaflash.runlog import RunLog
    from jobs.progress import run_progress

    log = RunLog.open(tmp_path / "ws")
    cells, train = log.create_run("bench", name="cells"), log.create_run("train", name="toy")
    for value in (10.0, 12.0):
        log.log_metrics(cells, {"output_throughput": value})
    for step in (1, 2, 3):
        log.log_metrics(train, {"loss": 1.0 / step, "lr": 0.1}, step=step)
    bench_log = tmp_path / "bench.log"
    bench_log.write_text("starting the dflash server on http://127.0.0.1:1234\n")
    now = time.time()
    view = SimpleNamespace(
        run={"id": "R", "created_at": now - 100, "config": {"jobs": {
            "train": {"description": "a toy training"},
            "bench": {"progress_metric": "output_throughput", "progress_count": True, "progress_total": 6},
            "compare": {"description": "the table"}}}},
        jobs=[{"name": "train", "status": "running", "started_at": now - 50},
              {"name": "bench", "status": "running", "started_at": now - 20, "log_path": str(bench_log)},
              {"name": "compare", "status": "pending"}],
        child_runs=[{"id": train, "job": "train"}, {"id": cells, "job": "bench"}])
    progress = run_progress(log, view, previous={"compare": 3.0})
    train_step, bench_step, compare_step = progress.steps
    assert train_step.detail() == "step 3"  # no `progress` declared: the highest step it recorded
    assert bench_step.detail() == "2/6 (33%) · starting the dflash server on http://127.0.0.1:1234"
    assert compare_step.status == "pending" and compare_step.timing() == "last run 0:03"
    assert progress.total == 3 and progress.completed == 0
    assert "step 1/3 train: step 3" in progress.line() and "step 2/3 bench: 2/6" in progress.line()
