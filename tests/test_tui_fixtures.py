"""Shared pieces of the TUI tests: a deterministic run log, a fake GPU inventory, waiting helpers.

Everything is fixed (ids, timestamps, pids, GPU readings) so SVG snapshots are stable; the
few tests here check the fixture itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from textual.worker import WorkerCancelled, WorkerFailed, WorkerState

from adaflash.runlog import RunLog
from jobs.gpus import GpuInfo, GpuProcess, HostInfo, JobRef, Snapshot

T0 = 1740823200.0  # 2025-03-01 10:00:00 UTC
RECIPE_RUN = "20250301-100000-recipe-a1b2"
PIPELINE_RUN = "20250301-101000-pipeline-c3d4"
MATRIX_RUN = "20250301-103000-bench-matrix-e5f6"
GENERATE_RUN = "20250228-090000-generate-0a0b"
SERVE_RUN = "20250228-120000-serve-0c0d"
PIPELINE_PID = 424242
FIXED_RUN_ID = "20250301-120000-recipe-test"


class FakeInventory:
    """A GPU inventory that always reports the same machine (or no GPU at all)."""

    def __init__(self, gpus: int = 2, *, available: bool = True) -> None:
        self.available = available and gpus > 0
        self.count = gpus if self.available else 0
        self.calls = 0

    def snapshot(self) -> Snapshot:
        self.calls += 1
        host = HostInfo(cpu_percent=37.5, cpu_count=16, memory_used=48 * 2**30, memory_total=128 * 2**30,
                        memory_percent=37.5, load_average=(2.5, 2.0, 1.5))
        if not self.available:
            return Snapshot(False, "NVIDIA driver not available: NVML Shared Library Not Found", [], host,
                            time=T0)
        gpus = []
        for i in range(self.count):
            procs = []
            if i == 0:
                procs.append(GpuProcess(PIPELINE_PID + 1, "python", 60 * 2**30, "compute",
                                        JobRef(RECIPE_RUN, "pipeline", 2, PIPELINE_PID)))
            j = i % 2
            gpus.append(GpuInfo(index=i, name="NVIDIA H200", uuid=f"GPU-{i}", memory_used=(70 - 40 * j) * 2**30,
                                memory_total=141 * 2**30, utilization=90.0 - 60 * j, memory_utilization=40.0,
                                temperature=61.0 - 10 * j, power=500.0 - 300 * j, power_limit=700.0,
                                processes=procs))
        return Snapshot(True, None, gpus, host, "560.35.03", "12.6", time=T0)


def _job(log: RunLog, run_id: str, name: str, command: list[str], *, role: str | None, gpus: str, status: str,
         start: float, end: float | None, pid: int, exit_code: int | None, restarts: int = 0,
         message: str | None = None, run_dir: Path) -> int:
    log_path = run_dir / f"{name}.log"
    job_id = log.add_job(run_id, name, command, role=role, gpus=gpus, log_path=str(log_path), status="pending")
    log.update_job(job_id, status=status, pid=pid, pgid=pid, pid_start_time=start, started_at=start, ended_at=end,
                   exit_code=exit_code, restarts=restarts, message=message)
    lines = [f"=== adaflash: start 1 of job {name}: {' '.join(command)}"]
    lines += [f"[{name}] step {i}: ok" for i in range(12)]
    lines.append(f"[{name}] done" if status == "finished" else f"[{name}] {status}")
    log_path.write_text("\n".join(lines) + "\n")
    return job_id


def bench_record(method: str, dataset: str, concurrency: int, throughput: float, tau: float | None,
                 ttft: float, itl: float, accuracy: float) -> dict[str, Any]:
    return {
        "method": method, "target": "smollm2-135m", "dataset": dataset, "concurrency": concurrency,
        "max_concurrency": concurrency, "num_prompts": 8, "completed": 8, "output_throughput": throughput,
        "accept_length": tau, "accept_rate": None if tau is None else (tau - 1) / 15, "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 1.8, "median_tpot_ms": itl, "p99_tpot_ms": itl * 1.5, "median_itl_ms": itl,
        "p99_itl_ms": itl * 2.2, "accuracy": accuracy, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 128,
        "hardware": "cpu", "matrix_run": MATRIX_RUN, "label": None,
    }


def fill_runlog(workspace: Path) -> RunLog:
    """A workspace with a finished recipe run, its pipeline child run, a bench matrix and older runs."""
    log = RunLog.open(workspace)
    runs = workspace / "runs"

    def run(run_id: str, kind: str, created: float, ended: float | None, status: str, **fields: Any) -> Path:
        run_dir = runs / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        log.create_run(kind, run_id=run_id, run_dir=str(run_dir), status=status, **fields)
        log.update_run(run_id, created_at=created, ended_at=ended, pid=1000)
        return run_dir

    recipe_dir = run(RECIPE_RUN, "recipe", T0, T0 + 3600, "finished", name="smollm2-cpu")
    log.update_run(RECIPE_RUN, note="every task finished")
    _job(log, RECIPE_RUN, "prepare", ["adaflash", "data", "prepare", "gsm8k"], role=None, gpus="cpu",
         status="finished", start=T0 + 5, end=T0 + 65, pid=424200, exit_code=0, run_dir=recipe_dir)
    _job(log, RECIPE_RUN, "pipeline", ["adaflash", "pipeline", "--preset", "adaflash"], role=None, gpus="0,1",
         status="finished", start=T0 + 600, end=T0 + 1800, pid=PIPELINE_PID, exit_code=0, restarts=1,
         run_dir=recipe_dir)
    _job(log, RECIPE_RUN, "bench", ["adaflash", "bench", "matrix"], role="server", gpus="0", status="failed",
         start=T0 + 1800, end=T0 + 3500, pid=424300, exit_code=1, message="exit code 1\nTraceback ...",
         run_dir=recipe_dir)

    pipe_dir = run(PIPELINE_RUN, "pipeline", T0 + 600, T0 + 1800, "finished", method="adaflash",
                   target="smollm2-135m", dataset="gsm8k", draft="drafters/adaflash-init")
    log.update_run(PIPELINE_RUN, pid=PIPELINE_PID, host=os.uname().nodename)
    log.update_run(RECIPE_RUN, host=os.uname().nodename)
    _job(log, PIPELINE_RUN, "inference", ["python", "-m", "adaflash.pipeline.worker", "inference"],
         role="inference", gpus="0", status="finished", start=T0 + 601, end=T0 + 1790, pid=424250, exit_code=0,
         run_dir=pipe_dir)
    _job(log, PIPELINE_RUN, "training", ["torchrun", "-m", "adaflash.pipeline.worker", "training"],
         role="training", gpus="1", status="finished", start=T0 + 602, end=T0 + 1790, pid=424251, exit_code=0,
         run_dir=pipe_dir)
    rows = []
    for step in range(40):
        t = T0 + 610 + step * 25
        version = step // 10
        rows += [
            {"run_id": PIPELINE_RUN, "job": "inference", "step": step, "name": "tau", "value": 2.0 + 0.35 * version
             + 0.05 * (step % 3), "time": t},
            {"run_id": PIPELINE_RUN, "job": "inference", "step": step, "name": "tokens_per_s",
             "value": 40.0 + 6 * version + step % 4, "time": t},
            {"run_id": PIPELINE_RUN, "job": "inference", "step": step, "name": "drafter_version", "value": version,
             "time": t},
            {"run_id": PIPELINE_RUN, "job": "inference", "step": step, "name": "samples", "value": 16 * (step + 1),
             "time": t},
            {"run_id": PIPELINE_RUN, "job": "inference", "step": step, "name": "buffer_depth",
             "value": 8 + (step * 7) % 13, "time": t},
            {"run_id": PIPELINE_RUN, "job": "training", "step": step, "name": "loss", "value": 3.0 / (1 + step / 8),
             "time": t + 5},
            {"run_id": PIPELINE_RUN, "job": "training", "step": step, "name": "loss_rkl",
             "value": 2.0 / (1 + step / 6), "time": t + 5},
        ]
        # what `pipeline status` reads: per version, the requests it finished and their τ (4 a flush)
        rows += [{"run_id": PIPELINE_RUN, "job": "inference", "step": None, "version": version, "name": name,
                  "value": value, "time": t} for name, value in (
                      ("served_requests", 4), ("served_tau_sum", 4 * (2.1 + 0.3 * version + 0.02 * (step % 5))),
                      ("served_tokens", 4 * 96), ("served_verify", 4 * 96 / (2.0 + 0.3 * version)))]
    with log._write():
        log.db["metrics"].insert_all(rows)

    matrix_dir = run(MATRIX_RUN, "bench-matrix", T0 + 1800, T0 + 3500, "finished", name="smollm2-cpu matrix",
                     target="smollm2-135m", dataset="gsm8k")
    del matrix_dir
    table = [
        ("vanilla", "gsm8k", 1, 20.0, None, 40.0, 48.0, 0.30), ("dflash", "gsm8k", 1, 41.0, 3.10, 45.0, 24.0, 0.30),
        ("adaflash", "gsm8k", 1, 52.0, 3.90, 44.0, 19.0, 0.31), ("vanilla", "gsm8k", 4, 60.0, None, 80.0, 62.0, 0.30),
        ("dflash", "gsm8k", 4, 96.0, 3.00, 92.0, 40.0, 0.29), ("adaflash", "gsm8k", 4, 111.0, 3.70, 90.0, 35.0, 0.30),
        ("vanilla", "humaneval", 1, 19.0, None, 42.0, 50.0, 0.12),
        ("adaflash", "humaneval", 1, 44.0, 3.40, 47.0, 22.0, 0.12),
    ]
    for item in table:
        log.add_bench_result(MATRIX_RUN, bench_record(*item))

    run(GENERATE_RUN, "generate", T0 - 90000, T0 - 89990, "finished", method="vanilla", target="smollm2-135m",
        dataset="prompt")
    run(SERVE_RUN, "serve", T0 - 79200, T0 - 79000, "failed", method="dflash", target="Qwen/Qwen3-8B",
        dataset=None, draft="z-lab/Qwen3-8B-DFlash-b16")
    log.update_run(SERVE_RUN, note="job server failed: CUDA out of memory")
    return log


def tiny_recipe(path: Path, *, seconds: float = 60.0) -> Path:
    """A one-job CPU recipe whose job writes a few metrics to the run log, then sleeps until stopped."""
    code = (
        "import os, time\n"
        "from adaflash.runlog import RunLog\n"
        "log = RunLog.open(os.environ['ADAFLASH_WORKSPACE'])\n"
        "run = os.environ['ADAFLASH_RUN_ID']\n"
        "for step in range(5):\n"
        "    log.log_metrics(run, {'tau': 2.0 + step / 10, 'tokens_per_s': 10.0 + step,"
        " 'drafter_version': step // 2}, step=step, job='inference')\n"
        "    print('step', step, flush=True)\n"
        "    time.sleep(0.05)\n"
        "print('tiny job ready', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    path.write_text(
        "[run]\nname = \"tiny\"\ndescription = \"a tiny CPU job for the TUI tests\"\n\n"
        "[gpus]\ninference = \"cpu\"\n\n"
        "[jobs.worker]\n"
        f"command = [\"python\", \"-c\", {json.dumps(code)}]\n"
        "role = \"inference\"\nstop_grace = 3\n"
    )
    return path


def fake_pipeline_recipe(path: Path, *, step_seconds: float = 4.0, stop_grace: float = 1.0) -> Path:
    """A one-job recipe whose job behaves as `adaflash pipeline` does when asked to stop: it records a pipeline
    run with a swap dir, takes SIGTERM as a stop request (the STOP file), finishes the training step in flight
    (`step_seconds`, longer than the job's `stop_grace`), publishes a final version and records its end."""
    code = (
        "import os, signal, time\n"
        "from pathlib import Path\n"
        "from adaflash.runlog import RunLog\n"
        "from adaflash.pipeline.buffer import SwapBuffer\n"
        "ws = os.environ['ADAFLASH_WORKSPACE']\n"
        "log = RunLog.open(ws)\n"
        "swap = Path(ws) / ('swap-' + os.environ['ADAFLASH_RUN_ID'])\n"
        "rid = log.create_run('pipeline', config={'swap_dir': str(swap)}, run_dir=str(swap), method='adaflash')\n"
        "buffer = SwapBuffer(swap)\n"
        "signal.signal(signal.SIGTERM, lambda *_: buffer.request_stop())\n"
        "job = log.add_job(rid, 'training', ['train'], role='training', status='running')\n"
        "step = 0\n"
        "while not buffer.stop_requested():\n"
        "    step += 1\n"
        "    log.log_metrics(rid, {'training_step': step}, step=step, job='training')\n"
        "    print('pipeline step', step, flush=True)\n"
        "    time.sleep(0.2)\n"
        f"time.sleep({step_seconds})  # the training step in flight\n"
        "log.log_metrics(rid, {'published_version': step}, step=step, job='training')\n"
        "log.update_job(job, status='stopped', exit_code=0, ended_at=time.time())\n"
        "log.finish_run(rid, 'stopped', note='stopped on request: both workers finished their step, "
        "a final version published')\n"
        "print('pipeline stopped cleanly', flush=True)\n"
    )
    path.write_text(
        "[run]\nname = \"fake-pipeline\"\ndescription = \"a pipeline stand-in for the TUI tests\"\n\n"
        "[gpus]\ninference = \"cpu\"\n\n"
        "[jobs.pipeline]\n"
        f"command = [\"python\", \"-c\", {json.dumps(code)}]\n"
        f"role = \"inference\"\nstop_grace = {stop_grace:g}\n"
    )
    return path


async def settle(pilot: Any, rounds: int = 20) -> None:
    """Let every read land: await the workers, then the messages they posted, until all is quiet.

    First every lazily mounted tab pane must be there (they mount right after the first paint).
    """
    from tui.app import PANES

    deadline = time.monotonic() + 10
    while any(pilot.app.pane(tab) is None for tab in PANES) and time.monotonic() < deadline:
        await pilot.pause(0.01)
    for _ in range(rounds):
        for worker in list(pilot.app.workers):
            # exclusive workers flag finished siblings as cancelled; failures are shown in the UI
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()
        await pilot.pause()
        running = any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in pilot.app.workers)
        # a worker may be done while the message it posted still waits: the pane is busy until applied
        if not running and not any(pane.busy for pane in pilot.app.panes.values()):
            return


async def wait_for(pilot: Any, predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """For external processes (a launched job): poll the app until `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def screen_text(app: Any) -> str:
    """The screen as plain text (for assertions on what the user sees)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def test_fixture_runlog_is_complete(tmp_path: Path) -> None:
    log = fill_runlog(tmp_path / "ws")
    assert {r["id"] for r in log.list_runs()} == {RECIPE_RUN, PIPELINE_RUN, MATRIX_RUN, GENERATE_RUN, SERVE_RUN}
    assert len(log.metrics_since(0, run_id=PIPELINE_RUN)) == 440
    assert len(log.bench_results()) == 8

    recipe = log.get_run(RECIPE_RUN)
    assert [c["id"] for c in log.child_runs(recipe)] == [PIPELINE_RUN]


def test_fake_inventory_snapshots() -> None:
    snap = FakeInventory(2).snapshot()
    assert snap.available and [g.index for g in snap.gpus] == [0, 1]
    assert snap.gpus[0].processes[0].job.run_id == RECIPE_RUN
    none = FakeInventory(available=False).snapshot()
    assert not none.available and none.choices() == ["cpu"]
