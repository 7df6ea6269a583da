"""Prefills beside decoding (`EngineConfig(async_prefill=True)`): admitted prompts join the batch a step later.

On a GPU the prefill runs on a side stream; here, on padded shapes on a CPU, it runs as it is launched
and joins at the next step, so the scheduling is what is tested: outputs equal the plain engine's, the
reserved slots never pad a pass, aborts and swaps while an admission is out, sampled prompts admitted
the usual way.
"""

from __future__ import annotations

import pytest
import torch

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.engine.passes import DevicePasses
from adaflash.models.loading import load_target
from tests.test_engine_lossless import drafter_for, stepwise
from tests.test_engine_overlap import plain, requests_for


def beside(target, method: str, *, async_prefill: bool = True) -> Engine:
    drafter = drafter_for(method, target) if method != "vanilla" else None
    return Engine(target, method, drafter,
                  config=EngineConfig(max_batch=4, max_len=512, pad_shapes=True, async_prefill=async_prefill, use_length_head=False if method == "adaflash" else None))


@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash"])
def test_admissions_beside_decoding_are_lossless_and_join_a_step_later(tiny_target, method, monkeypatch):
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = beside(tiny_target, method)
    assert engine.async_prefill
    fills, rows_for = [], DevicePasses.rows_for

    def spy(passes, slots, *, fill):
        out = rows_for(passes, slots, fill=fill)
        if engine._admission is not None:  # an admission is out: its slots must not pad the pass
            reserved = {s.slot for s in engine._admission.seqs}
            fills.append(not (reserved & set(out[0])))
        return out

    monkeypatch.setattr(DevicePasses, "rows_for", spy)
    outputs = engine.generate(requests_for(tiny_target))
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    assert fills and all(fills)  # passes ran while admissions were out, never over their slots
    assert engine._admission is None and not engine.has_work()
    # 8 prompts, 4 slots: the first admission at once (idle), the rest beside decoding
    assert engine.step_counts["prefill"] >= 2


def test_a_prefill_beside_decoding_is_read_at_the_next_step(tiny_target):
    engine = beside(tiny_target, "vanilla")
    requests = requests_for(tiny_target)
    for request in requests:
        engine.add(request)
    engine.step()  # idle: the first four are admitted and prefilled at once
    assert len(engine.active) == 4 and engine._admission is None
    while len(engine.active) == 4:
        engine.step()
    while engine._admission is None:  # a row finished: the next step launches an admission beside
        engine.step()
    out = engine._admission
    events = engine.step()  # ... and the one after it joins its rows, with their first tokens
    assert engine._admission is not out
    joined = {s.request.rid for s in out.seqs}
    assert joined <= {s.request.rid for s in engine.active.values()} | {e.rid for e in events}
    assert joined & {e.rid for e in events}


def test_an_abort_while_its_admission_is_out_frees_its_slot(tiny_target):
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = beside(tiny_target, "dflash")
    dropped = None

    def drop_one():
        nonlocal dropped
        if dropped is None and engine._admission is not None:
            dropped = engine._admission.seqs[0].request.rid
            assert engine.abort(dropped) and not engine.abort(dropped)

    done = stepwise(engine, requests_for(tiny_target), drop_one)
    assert dropped is not None and dropped not in done
    assert {rid: o.output_ids for rid, o in done.items()} == {
        rid: o.output_ids for rid, o in reference.items() if rid != dropped}


def test_a_swap_joins_the_admission_out_first(tiny_target):
    """The new drafter's context is rebuilt for every row, so the rows of an admission out join before it."""
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = beside(tiny_target, "dflash")
    done: dict = {}
    swapped = False

    def swap_once():
        nonlocal swapped
        if not swapped and engine._admission is not None:
            out = {s.request.rid for s in engine._admission.seqs}
            engine.swap_drafter(drafter_for("dflash", tiny_target), version=2)
            swapped = True
            assert engine._admission is None and out <= {s.request.rid for s in engine.active.values()} | set(done)

    stepwise(engine, requests_for(tiny_target), swap_once, done)
    assert swapped and engine.drafter_version == 2
    assert {rid: o.output_ids for rid, o in done.items()} == {rid: o.output_ids for rid, o in reference.items()}


def test_sampled_prompts_are_admitted_the_usual_way(tiny_target, monkeypatch):
    """A sampled first token would share the engine's generator across streams: such admissions prefill at
    once, and outputs stay those of the same seed without prefills beside."""
    def run(async_prefill: bool):
        engine = beside(tiny_target, "vanilla", async_prefill=async_prefill)
        requests = [Request(r.prompt_ids, SamplingParams(max_new_tokens=r.params.max_new_tokens, temperature=0.8,
                                                         ignore_eos=True), rid=r.rid)
                    for r in requests_for(tiny_target)]
        return engine, {o.rid: o.output_ids for o in engine.generate(requests)}

    engine, sampled = run(True)
    assert engine._admission is None and sampled == run(False)[1]
    began = []
    monkeypatch.setattr(Engine, "_begin_admission", lambda self: began.append(1))
    run(True)
    assert began == []


def test_off_by_default_and_without_padding(tiny_target):
    assert not Engine(tiny_target, "vanilla",
                      config=EngineConfig(max_batch=2, max_len=256, pad_shapes=True)).async_prefill
    assert not Engine(tiny_target, "vanilla",
                      config=EngineConfig(max_batch=2, max_len=256, async_prefill=True)).async_prefill


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a side stream needs a GPU")
@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash"])
def test_prefills_on_a_side_stream_give_the_cpu_engines_tokens(tiny_llama, method, monkeypatch):
    """fp32 on the GPU, every graph captured first: admissions prefilled on the side stream while the batch
    decodes, with a slot pattern where free slots would otherwise pad the passes, give the eager CPU
    engine's greedy tokens."""
    cpu = load_target(str(tiny_llama), device="cpu")
    gpu = load_target(str(tiny_llama), device="cuda", dtype="float32")
    reference = plain(cpu, requests_for(cpu))
    drafter = drafter_for(method, gpu) if method != "vanilla" else None
    engine = Engine(gpu, method, drafter, config=EngineConfig(max_batch=4, max_len=512, async_prefill=True))
    assert engine._side is not None
    engine.capture_graphs()
    began, begin = [], Engine._begin_admission
    monkeypatch.setattr(Engine, "_begin_admission", lambda self: began.append(1) or begin(self))
    outputs = engine.generate(requests_for(gpu))
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    assert began


@pytest.mark.parametrize("method", ["vanilla", "dflash"])
def test_a_wide_admission_is_split_to_the_prefill_token_budget(tiny_target, method, monkeypatch):
    """Every slot free and long prompts waiting: the prefill takes only as many prompts as its padded
    token budget holds (a pass over all of them overflowed 32-bit offsets on a GPU), and the output
    is the same as one wide admission's."""
    from adaflash.engine import admission

    requests = requests_for(tiny_target)
    widest = max(len(r.prompt_ids) for r in requests)
    wide = Engine(tiny_target, method, drafter_for(method, tiny_target) if method != "vanilla" else None,
                  config=EngineConfig(max_batch=8, max_len=512, use_length_head=None))
    reference = {o.rid: o.output_ids for o in wide.generate(requests_for(tiny_target))}
    wide_prefills = wide.step_counts["prefill"]
    monkeypatch.setattr(admission, "PREFILL_TOKENS", 2 * widest)
    engine = Engine(tiny_target, method, drafter_for(method, tiny_target) if method != "vanilla" else None,
                    config=EngineConfig(max_batch=8, max_len=512, use_length_head=None))
    sizes = []
    admitted = engine._admitted

    def spy():
        seqs = admitted()
        sizes.append(len(seqs))
        return seqs

    monkeypatch.setattr(engine, "_admitted", spy)
    outputs = engine.generate(requests_for(tiny_target))
    assert {o.rid: o.output_ids for o in outputs} == reference
    assert sizes and max(sizes) <= 2  # never more prompts than two of the widest fit
    assert engine.step_counts["prefill"] > wide_prefills
