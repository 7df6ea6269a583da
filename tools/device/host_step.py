"""An engine step's host time with the device's work replaced by fixed answers: what a GPU would wait for if the
host were slower than its step. Runs on a CPU. Usage: host_step.py BATCH,BATCH,... [TARGET] [METHOD,METHOD,...] [COSTS]
(TARGET: a small model folder, e.g. from `adaflash models synth qwen3-tiny`; METHODs: vanilla, dflash or
adaflash, taking turns in one process, with a fresh one-layer block-8 drafter; each step accepts 0 or 1 drafts at random;
COSTS: flat or rising, the step times AdaFlash's cost rule is told, `stubbed_engine`).

It prints two figures per method and batch size, medians over the turns:
- the host time of a whole step: it must stay below the device's step, or the device waits;
- the time from a step's read to the next launch: the device idles through it whatever the step costs,
  since an overlapped step is launched only once the one before it is read (`Engine.step`)."""

import random
import statistics
import sys
import time

import torch

from adaflash.engine.build import build_engine
from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.models.drafter_io import new_drafter


def stubbed_engine(target: str, batch: int, method: str, costs: str = "flat") -> Engine:
    """An engine whose passes answer at once: every row emits token 7 after accepting 0 or 1 drafts. The cost
    rule is told each step took 1 ms (`costs` flat: whole blocks win, its cheap path) or 1 ms more by 15% a
    verified position (rising: it weighs its modes and sizes widths every step), whatever the host took."""
    config = EngineConfig(max_batch=batch, max_len=1024, overlap=True, pad_shapes=True, length_policy="cost")
    engine = build_engine(target, "vanilla", config=config, device="cpu", dtype="float32")
    if method != "vanilla":
        drafter = new_drafter("dflash", engine.model.cfg, layers=1, block_size=8, length_head=method == "adaflash")
        engine = Engine(engine.target, method, drafter, config=config)
    if method == "adaflash":
        rule, record = engine._cost_rule(), engine._cost_rule().record
        rule.record = lambda batch, width, seconds, *args, **kwargs: record(
            batch, width, 1e-3 * (1 + 0.15 * width * (costs == "rising")), *args, **kwargs)
    passes, vocab, draw = engine.passes, engine.model.cfg.vocab_size, random.Random(0)
    made: dict[tuple[int, int, bool], list[torch.Tensor]] = {}

    def answer(rows: int, drafts: int, predict: bool) -> torch.Tensor:
        """One of eight answers drawn once per shape: drawing them is no part of the host's step."""
        if (rows, drafts, predict) not in made:
            made[rows, drafts, predict] = [torch.tensor([
                [min(drafts, draw.randint(0, 1)), drafts] + [7] * (drafts + 1) + ([draw.randint(1000, 60000)] if predict else [])
                for _ in range(rows)]) for _ in range(8)]
        return draw.choice(made[rows, drafts, predict])

    passes._greedy_step_fn = lambda kv: lambda rows_p, block_p, lens_p, verify_n_p, verified=0: answer(len(rows_p), 0, False)
    passes.draft_and_step = lambda rows, pending, lens, longest, *, steps, predict=False, in_order=False: answer(
        len(rows), steps or 7, predict and method == "adaflash")
    passes.prefill = lambda ids, rows, length: torch.zeros(ids.shape[0], vocab)
    passes.admit = lambda *args, **kwargs: None
    for i in range(batch):
        engine.add(Request(prompt_ids=[5] * 40, params=SamplingParams(max_new_tokens=900, ignore_eos=True), rid=str(i)))
    return engine


class Timed:
    """An engine whose steps are timed, and the gap from each step's read to the next launch."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.gaps, self.blocks = engine, [], []
        read, land, launch = [0.0], engine._land, engine._launch

        def timed_land():
            read[0] = time.perf_counter()
            return land()

        def timed_launch(*args):
            self.gaps.append(time.perf_counter() - read[0])
            return launch(*args)

        engine._land, engine._launch = timed_land, timed_launch

    def run(self, steps: int) -> None:
        started = time.perf_counter()
        for _ in range(steps):
            self.engine.step()
        self.blocks.append((time.perf_counter() - started) / steps)


def host_us(target: str, batch: int, methods: list[str], costs: str = "flat", rounds: int = 12,
            block: int = 10) -> dict[str, tuple[float, float]]:
    """Per method: (host µs a step, µs from a step's read to the next launch), medians. The methods' engines
    take turns a block of steps at a time in one process, so a CPU whose speed drifts (a shared one moved
    by half over a minute) slows each alike; measured one after another they differed by 2× on such a CPU
    where in turns they were within 16%."""
    timed = {method: Timed(stubbed_engine(target, batch, method, costs)) for method in methods}
    for t in timed.values():
        t.run(20)
        t.gaps.clear()
        t.blocks.clear()
    for _ in range(rounds):
        for t in timed.values():
            t.run(block)
    return {method: (statistics.median(t.blocks) * 1e6, statistics.median(t.gaps) * 1e6) for method, t in timed.items()}


if __name__ == "__main__":
    target = sys.argv[2] if len(sys.argv) > 2 else "synth/qwen3-tiny"
    methods = (sys.argv[3] if len(sys.argv) > 3 else "vanilla").split(",")
    costs = sys.argv[4] if len(sys.argv) > 4 else "flat"
    for batch in (int(b) for b in sys.argv[1].split(",")):
        for method, (step, gap) in host_us(target, batch, methods, costs).items():
            print(f"{method} batch {batch}: {step / 1e3:.3f} ms of host time a step ({step / batch:.2f} us a row), "
                  f"{gap:.0f} us from a step's read to the next launch")
