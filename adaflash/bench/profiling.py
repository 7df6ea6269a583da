"""`bench engine --profile DIR`: which kernels (or, on a CPU, which ops) a method's steps are made of.

Why: the bench's pass timings say how long a step takes; a speculative step's extra time over
Vanilla's is tens of small kernels, and only a profile names them. It runs after the measured run,
on the same warmed engine (its CUDA graphs captured), so nothing measured changes: the prompts are
queued again, the first step (the admission: the prefill of as many prompts as the batch takes) is
recorded on its own, the batch fills for `warm_steps`, then `steps` engine steps are recorded with
torch.profiler, and the rest is aborted. The prefill gets its own table because at large batches it
takes a third or more of the wall time, in kernels of other shapes than a decode step's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP_ROWS = 25  # kernels (ops) in the summary table, by their own device (CPU) time


@dataclass
class Profiled:
    """What a profile wrote, and over how many engine steps (the table's totals are over all of them)."""

    trace: Path  # Chrome trace: chrome://tracing or https://ui.perfetto.dev
    table: Path  # the top kernels (ops) by self time, as torch.profiler tabulates them
    steps: int
    prefill_table: Path  # the same for the first step, the admission's prefill
    admitted: int  # prompts that step prefilled


def new_profiler(on_cuda: bool) -> Any:
    """A torch.profiler over the CPU, and the GPU's kernels when there is one."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else []))


def write_profile(prof: Any, out: Path, name: str, header: str, *, on_cuda: bool,
                  rows: int = TOP_ROWS) -> tuple[Path, Path]:
    """The Chrome trace and the top `rows` kernels (ops) by their own time, headed by `header`: (trace, table)."""
    out.mkdir(parents=True, exist_ok=True)
    trace, table = out / f"{name}.trace.json", out / f"{name}.top.txt"
    prof.export_chrome_trace(str(trace))
    sort = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    summary = prof.key_averages().table(sort_by=sort, row_limit=rows)
    table.write_text(f"{header}, sorted by {sort}\n{summary}\n")
    return trace, table


def profile_engine(engine: Any, requests: list[Any], out: Path, name: str, *, steps: int, warm_steps: int,
                   on_cuda: bool) -> Profiled:
    """Queue `requests`, step `warm_steps` times, record the next `steps` steps, abort the rest."""
    import torch

    for request in requests:
        engine.add(request)
    waiting = len(engine.waiting)
    with new_profiler(on_cuda) as prof:
        engine.step()
        if on_cuda:
            torch.cuda.synchronize()
    admitted = waiting - len(engine.waiting)
    _, prefill_table = write_profile(prof, out, f"{name}-prefill", f"{name}: the first engine step, the prefill of "
                                     f"{admitted} prompts", on_cuda=on_cuda)
    for _ in range(warm_steps - 1):
        if not engine.has_work():
            break
        engine.step()
    recorded = 0
    with new_profiler(on_cuda) as prof:
        while recorded < steps and engine.has_work():
            engine.step()
            recorded += 1
        if on_cuda:
            torch.cuda.synchronize()
    for request in requests:
        engine.abort(request.rid)
    if recorded == 0:
        raise ValueError(f"{name}: nothing left to profile after {warm_steps} warm-up steps; "
                         "give more prompts or --max-new-tokens")
    trace, table = write_profile(prof, out, name, f"{name}: {recorded} engine steps after {warm_steps} warm-up "
                                 f"steps; totals are over all {recorded}", on_cuda=on_cuda)
    return Profiled(trace, table, recorded, prefill_table, admitted)
