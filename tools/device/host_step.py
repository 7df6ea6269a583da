"""An engine step's host time with the device's work replaced by a fixed answer: what a GPU would wait for if
the host were slower than its step. Runs on a CPU. Usage: host_step.py BATCH,BATCH,... [TARGET]
(TARGET: a small model folder, e.g. from `adaflash models synth qwen3-tiny`)."""

import sys
import time

import torch

from adaflash.engine.build import build_engine
from adaflash.engine.config import EngineConfig
from adaflash.engine.params import Request, SamplingParams


def host_ms(target: str, batch: int, steps: int = 60) -> float:
    engine = build_engine(target, "vanilla", config=EngineConfig(max_batch=batch, max_len=512, overlap=True,
                                                                 pad_shapes=True), device="cpu", dtype="float32")
    passes, vocab = engine.passes, engine.model.cfg.vocab_size
    answer = torch.tensor([[0, 0, 7]] * batch)  # accepted, verified, the token: every row emits token 7

    def stub_step(rows_p, block_p, lens_p, verify_n_p, verified=0):
        return answer[: rows_p.shape[0]]

    passes._greedy_step_fn = lambda kv: stub_step
    passes.prefill = lambda ids, rows, length: torch.zeros(ids.shape[0], vocab)
    for i in range(batch):
        engine.add(Request(prompt_ids=[5] * 40, params=SamplingParams(max_new_tokens=400, ignore_eos=True), rid=str(i)))
    for _ in range(3):
        engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - started) / steps * 1e3


if __name__ == "__main__":
    target = sys.argv[2] if len(sys.argv) > 2 else "synth/qwen3-tiny"
    for batch in (int(b) for b in sys.argv[1].split(",")):
        ms = min(host_ms(target, batch) for _ in range(3))
        print(f"batch {batch}: {ms:.3f} ms of host time a step ({ms / batch * 1e3:.2f} us a row)")
