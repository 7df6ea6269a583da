"""Measure adaflash-tui: start-up to first paint, and one Monitor refresh over a million metric rows.

    python -m tui.bench_tui [--rows 1000000] [--new-rows 1000] [--repeat 5] [--json]

Method (headless, with App.run_test(), in a temporary workspace):
- start-up: a fresh interpreter imports tui.app (timed apart), then per repeat an app on an empty
  workspace is built and run; "first paint" is the moment run_test hands over the pilot (the first
  screen is composed, mounted and drawn); "ready" is when every tab is mounted and every initial
  read has landed.
- refresh: one run gets N metric rows (one executemany, the names the pipeline records); the app
  follows it and catches up (timed too); then each repeat adds `--new-rows` rows and times one
  incremental refresh, then one refresh with no new row. Each refresh is split into the read in
  the worker thread (the run-log query for rows after the last id) and the apply on the UI thread
  (folding rows into the model, redrawing charts and tables), plus the end to end time from the
  tick to the applied result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("tau", "tokens_per_s", "drafter_version", "samples", "buffer_depth", "loss", "loss_ce", "loss_rkl",
         "loss_fkl", "lr")


class _NoGpu:
    """The inventory of a machine without GPUs (keeps NVML out of the timings)."""

    def snapshot(self) -> Any:
        from jobs.gpus import Snapshot, host_info

        return Snapshot(False, "benchmark: no GPU inventory", [], host_info(None))


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import tui.app; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


async def _quiet(pilot: Any) -> None:
    from textual.worker import WorkerCancelled, WorkerFailed, WorkerState

    for _ in range(20):
        for worker in list(pilot.app.workers):
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()
        await pilot.pause()
        if not any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in pilot.app.workers):
            return


async def startup(repeat: int, size: tuple[int, int]) -> dict[str, float]:
    from tui.app import AdaflashApp

    first, ready = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            app = AdaflashApp(Path(tmp), inventory=_NoGpu(), live=False)
            async with app.run_test(size=size) as pilot:
                first.append(time.perf_counter() - start)
                await _quiet(pilot)
                ready.append(time.perf_counter() - start)
    return {"first_paint_s": statistics.median(first), "ready_s": statistics.median(ready),
            "first_paint_min_s": min(first)}


def fill(workspace: Path, rows: int) -> str:
    """One run with `rows` metric rows, written with one executemany."""
    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    run_id = log.create_run("pipeline", name="bench", method="adaflash", target="smollm2-135m", dataset="gsm8k")
    rng = random.Random(0)
    t0 = time.time() - rows / 100
    data = []
    for i in range(rows):
        name = NAMES[i % len(NAMES)]
        step = i // len(NAMES)
        data.append((run_id, "training" if name.startswith(("loss", "lr")) else "inference", step, name,
                     step // 500 if name == "drafter_version" else rng.random() * 4, t0 + i / 100))
    with log._write() as conn:
        conn.executemany("INSERT INTO metrics (run_id, job, step, name, value, time) VALUES (?, ?, ?, ?, ?, ?)",
                         data)
    log.close()
    return run_id


def append(workspace: Path, run_id: str, rows: int, start_step: int) -> None:
    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    now = time.time()
    data = [(run_id, "inference", start_step + i // len(NAMES), NAMES[i % len(NAMES)], 1.0 + i % 7, now)
            for i in range(rows)]
    with log._write() as conn:
        conn.executemany("INSERT INTO metrics (run_id, job, step, name, value, time) VALUES (?, ?, ?, ?, ?, ?)",
                         data)
    log.close()


async def _one_refresh(pilot: Any, monitor: Any) -> dict[str, float]:
    """Time one refresh: the read (worker), the apply (UI thread), and tick -> applied."""
    request = monitor.request()
    t = time.perf_counter()
    batch = await asyncio.to_thread(monitor.read, request)
    read_s = time.perf_counter() - t
    # the same rows once more through the real path, timed end to end, with the apply timed inside
    applied: dict[str, float] = {}
    original = monitor.apply

    def timed_apply(req: Any, result: Any) -> None:
        start = time.perf_counter()
        original(req, result)
        applied["apply_s"] = time.perf_counter() - start

    monitor.apply = timed_apply
    try:
        t = time.perf_counter()
        monitor.refresh_data()
        while "apply_s" not in applied:
            await asyncio.sleep(0.0005)
        e2e = time.perf_counter() - t
    finally:
        monitor.apply = original
    await pilot.pause()
    del batch
    return {"read_s": read_s, "apply_s": applied["apply_s"], "end_to_end_s": e2e}


async def refresh(rows: int, new_rows: int, repeat: int, size: tuple[int, int]) -> dict[str, Any]:
    from tui.app import AdaflashApp

    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        t = time.perf_counter()
        run_id = fill(workspace, rows)
        fill_s = time.perf_counter() - t
        app = AdaflashApp(workspace, inventory=_NoGpu(), live=False, run_id=run_id)
        async with app.run_test(size=size) as pilot:
            start = time.perf_counter()
            await _quiet(pilot)
            app.show_tab("monitor")
            monitor = app.pane("monitor")
            while monitor is None or monitor.model.rows_seen < rows:
                await pilot.pause(0.01)
                monitor = app.pane("monitor")
            catch_up_s = time.perf_counter() - start
            await _quiet(pilot)
            incremental, empty = [], []
            step = rows // len(NAMES) + 1
            for i in range(repeat):
                append(workspace, run_id, new_rows, step + i * new_rows)
                before = monitor.model.rows_seen
                incremental.append(await _one_refresh(pilot, monitor))
                assert monitor.model.rows_seen == before + new_rows, "the refresh did not read the new rows"
                empty.append(await _one_refresh(pilot, monitor))
                assert monitor.model.rows_seen == before + new_rows
            total = monitor.model.rows_seen

    def median(items: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(x[k] for x in items) for k in items[0]}

    return {"rows": rows, "fill_s": fill_s, "catch_up_s": catch_up_s, "rows_seen": total, "new_rows": new_rows,
            "incremental": median(incremental), "no_new_rows": median(empty)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tui.bench_tui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="metric rows in the run log")
    parser.add_argument("--new-rows", type=int, default=1_000, help="rows added before each incremental refresh")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (medians are reported)")
    parser.add_argument("--size", default="100x32", help="terminal size WxH")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    result = {"import_tui_app_s": import_seconds()}
    result["startup"] = asyncio.run(startup(args.repeat, size))  # type: ignore[arg-type]
    result["monitor"] = asyncio.run(refresh(args.rows, args.new_rows, args.repeat, size))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    s, m = result["startup"], result["monitor"]
    ms = lambda v: f"{1000 * v:.1f} ms"  # noqa: E731
    print(f"import tui.app (fresh interpreter)      {ms(result['import_tui_app_s'])}")
    print(f"start-up to first paint (median of {args.repeat})  {ms(s['first_paint_s'])} (min {ms(s['first_paint_min_s'])})")
    print(f"start-up until every tab is ready       {ms(s['ready_s'])}")
    print(f"run log: {m['rows']:,} metric rows written in {m['fill_s']:.1f} s; Monitor caught up in {m['catch_up_s']:.1f} s")
    for label, key in ((f"refresh with {m['new_rows']:,} new rows", "incremental"), ("refresh with no new row", "no_new_rows")):
        r = m[key]
        print(f"{label:<32} read {ms(r['read_s'])} · apply {ms(r['apply_s'])} · tick→applied {ms(r['end_to_end_s'])}")


if __name__ == "__main__":
    main()
