"""A prefill pass's time by shape (replayed from a graph where the engine would) and its kernels by device
time. Usage: prefill_pass.py TARGET OUT BxW,BxW,..."""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from adaflash.engine.build import build_engine
from adaflash.engine.config import EngineConfig


def main(target: str, out: str, shapes: list[tuple[int, int]]) -> None:
    engine = build_engine(target, "vanilla", config=EngineConfig(max_batch=max(b for b, _ in shapes), max_len=1280),
                          device="cuda")
    passes, lines = engine.passes, []
    for b, w in shapes:
        ids = torch.randint(100, 1000, (b, w), device="cuda")
        rows, length = torch.arange(b, device="cuda"), torch.full((b,), w - 5, device="cuda")
        for _ in range(3):
            passes.prefill(ids, rows, length)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(10):
            passes.prefill(ids, rows, length)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - started) * 100
        graph = "replayed" if passes.prefill_dims(b, w) is not None else "eager"
        lines.append(f"prefill of {b} x {w} ({graph}): {ms:.2f} ms, {b * w / ms / 1e3:.2f} M tokens/s")
        print(lines[-1], flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            passes.prefill(ids, rows, length)
            torch.cuda.synchronize()
        lines.append(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15))
    with open(out, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [tuple(int(x) for x in s.split("x")) for s in sys.argv[3].split(",")])
