"""Overlapped steps: the next greedy step is launched before the host takes the last one's tokens.

On a GPU that keeps the device busy while the host handles stops and events; here it runs on the CPU
(`overlap=True`), where the order of the host's work is the same, so what it changes is testable:
outputs, stops, aborts and swaps must be those of the plain engine.
"""

from __future__ import annotations

from collections import Counter

import pytest

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.engine.passes import PREDICTION_SCALE
from adaflash.engine.sequence import RunningSeq
from tests.test_engine_lossless import PROMPTS, drafter_for, generate_with_swap, oracle_engine


def requests_for(target, **params) -> list[Request]:
    """More prompts than slots, with different lengths: rows finish and are admitted mid-flight."""
    return [Request(target.encode(target.render(p)),
                    SamplingParams(**{"max_new_tokens": 12 + 7 * i, "ignore_eos": True, **params}), rid=f"r{i}")
            for i, p in enumerate(PROMPTS * 2)]


def plain(target, requests) -> dict[str, object]:
    engine = Engine(target, "vanilla", config=EngineConfig(max_batch=3, max_len=512, overlap=False))
    return {o.rid: o for o in engine.generate(requests)}


def overlapped(target, method, *, padded: bool = False):
    """`padded`: shapes padded to buckets as on a GPU (graphs off), where overlap is the default."""
    drafter = drafter_for(method, target) if method != "vanilla" else None
    return Engine(target, method, drafter,
                  config=EngineConfig(max_batch=3, max_len=512, overlap=None if padded else True, pad_shapes=padded, use_length_head=False if method == "adaflash" else None))


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash", "mtp"])
def test_overlapped_steps_are_lossless_and_launch_before_the_host_takes_tokens(tiny_target, method, padded,
                                                                                monkeypatch):
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = overlapped(tiny_target, method, padded=padded)
    assert engine.overlap
    in_flight, take = [], RunningSeq.take

    def spy(seq, new_ids, **kw):
        in_flight.append(engine._flight is not None)
        return take(seq, new_ids, **kw)

    monkeypatch.setattr(RunningSeq, "take", spy)
    outputs = engine.generate(requests_for(tiny_target))
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    assert all(o.meta_info["finish_reason"] == reference[o.rid].meta_info["finish_reason"] for o in outputs)
    # most tokens were taken while the next step was already on the device
    assert sum(in_flight) > len(in_flight) / 2, (sum(in_flight), len(in_flight))
    decode = engine.step_counts["decode" if method == "vanilla" else "whole"]
    assert decode > 0 and engine.step_counts["choose"] == 0


def test_a_stop_string_row_steps_once_more_for_nothing(tiny_target):
    reference = plain(tiny_target, requests_for(tiny_target))
    text = reference["r2"].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), text
    with_stop = requests_for(tiny_target, stop=[stop])
    want = plain(tiny_target, with_stop)
    engine = overlapped(tiny_target, "dflash")
    got = {o.rid: o for o in engine.generate(requests_for(tiny_target, stop=[stop]))}
    assert {rid: (o.output_ids, o.text) for rid, o in got.items()} == \
        {rid: (o.output_ids, o.text) for rid, o in want.items()}
    assert got["r2"].meta_info["finish_reason"] == {"type": "stop", "matched": stop}
    # the engine is idle and serves the next batch exactly, whatever was left in flight
    again = {o.rid: o.output_ids for o in engine.generate(requests_for(tiny_target))}
    assert again == {rid: o.output_ids for rid, o in reference.items()}


def test_an_abort_while_the_row_is_in_flight_drops_it(tiny_target):
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = overlapped(tiny_target, "vanilla")
    for request in requests_for(tiny_target):
        engine.add(request)
    events = engine.step() + engine.step()
    assert engine._flight is not None and any(s.request.rid == "r1" for s in engine._flight.seqs)
    assert engine.abort("r1")
    done = {}
    while engine.has_work():
        for event in engine.step():
            assert event.rid != "r1"
            if event.output:
                done[event.rid] = event.output.output_ids
    assert "r1" not in done and all(e.output is None for e in events)
    assert done == {rid: o.output_ids for rid, o in reference.items() if rid != "r1"}


def test_a_swap_reads_the_step_in_flight_first(tiny_target):
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = overlapped(tiny_target, "dflash")
    done = generate_with_swap(engine, requests_for(tiny_target), drafter_for("dflash", tiny_target), version=7)
    assert {rid: o.output_ids for rid, o in done.items()} == {rid: o.output_ids for rid, o in reference.items()}
    assert {o.meta_info["drafter_version"] for o in done.values()} == {7}


def test_sampling_rows_step_without_overlap_beside_greedy_ones(tiny_target):
    greedy = requests_for(tiny_target)
    reference = plain(tiny_target, greedy)
    sampled = [Request(r.prompt_ids, SamplingParams(max_new_tokens=20, temperature=0.8), rid=f"s{i}")
               for i, r in enumerate(greedy[:3])]
    engine = overlapped(tiny_target, "dflash")
    outputs = {o.rid: o.output_ids for o in engine.generate([*greedy, *sampled])}
    assert {rid: outputs[rid] for rid in reference} == {rid: o.output_ids for rid, o in reference.items()}
    assert all(1 <= len(outputs[f"s{i}"]) <= 20 for i in range(3))


def test_a_row_that_fills_its_context_is_not_stepped_again(tiny_target, monkeypatch):
    """A row ended by its length is known before its tokens are taken: stepping it once more would
    write past the cache (an illegal access on a GPU). The oracle drafter's whole blocks of 8 are
    accepted, so the last step overshoots the 26 tokens asked for by 7, which the cache keeps."""
    prompt = tiny_target.encode(tiny_target.render(PROMPTS[0]))
    fits = 26  # 1 token from the prefill, then 8 a step: the fourth step ends it at 33
    max_len = len(prompt) + fits + 9  # the engine's context margin at block 8: 7 drafts and two more

    def request():
        return [Request(prompt, SamplingParams(max_new_tokens=fits, ignore_eos=True), rid="full")]

    reference = plain(tiny_target, request())
    long = plain(tiny_target, [Request(prompt, SamplingParams(max_new_tokens=60, ignore_eos=True), rid="full")])
    engine = oracle_engine(tiny_target, request(), [long["full"]], error_rate=0.0)
    engine.max_len, engine.overlap = max_len, True
    assert engine.context_margin == max_len - fits - len(prompt)
    reach, launch = [], engine._launch

    def spy(rows, *plan):
        flight = launch(rows, *plan)
        reach.append(int(rows.lengths.max()) + flight.packed.shape[1] - 2)  # the cache length each row steps from
        return flight

    monkeypatch.setattr(engine, "_launch", spy)
    assert engine.generate(request())[0].output_ids == reference["full"].output_ids
    assert reach and max(reach) <= max_len


def test_adaflash_mixes_overlapped_whole_blocks_with_steps_the_head_sizes(tiny_target):
    """The cost rule probes widths and may let the head choose (steps the host must see) between whole
    blocks (overlapped): the switch either way keeps every row's tokens."""
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = Engine(tiny_target, "adaflash", drafter_for("adaflash", tiny_target),
                    config=EngineConfig(max_batch=3, max_len=512, pad_shapes=True, length_policy="cost"))
    outputs = engine.generate(requests_for(tiny_target))
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    assert engine.step_counts["whole"] > 0 and engine.step_counts["probe"] + engine.step_counts["choose"] > 0


def test_a_flight_is_timed_on_the_engines_clock(tiny_target):
    """A bench whose engines take turns stops each engine's clock between its turns, and a flight
    launched at the end of one turn is read in the next: its time must not count the other engines'."""
    engine = overlapped(tiny_target, "vanilla")
    engine.clock = lambda: 5.0  # stands still: the engine never had a turn
    engine.generate(requests_for(tiny_target)[:2])
    assert engine.step_counts["decode"] > 0 and engine.step_seconds["decode"] == 0.0


def test_pass_times_do_not_overlap(tiny_target):
    """Prefills run between flights, not inside one: the passes' times add up to no more than the run's,
    so a bench's "host time outside the passes" stays what it says."""
    import time

    engine = overlapped(tiny_target, "dflash")
    started = time.perf_counter()
    engine.generate(requests_for(tiny_target))  # 8 prompts in 3 slots: prefills while rows decode
    wall = time.perf_counter() - started
    assert engine.step_counts["prefill"] > 2
    assert sum(engine.step_seconds.values()) <= wall


def test_a_flight_records_no_autograd_graph(tiny_target):
    """The drafter's weights require grad (the pipeline trains its own copies): a launched step must not
    keep an autograd graph alive, as the plain step never did."""
    engine = overlapped(tiny_target, "dflash")
    assert any(p.requires_grad for p in engine.drafter.parameters())
    for request in requests_for(tiny_target)[:2]:
        engine.add(request)
    engine.step()
    engine.step()
    assert engine._flight is not None
    cache = engine.draft_cache
    assert not cache.k.requires_grad and not cache.v.requires_grad, "the drafter's cache would hold every step's graph"


def test_the_cost_rule_sizes_overlapped_steps_from_the_predictions_steps_bring_back(tiny_target, monkeypatch):
    """Where a shorter verify pays, the cost rule picks the batch's width before the launch, from the length
    head's predictions the steps before brought back with their tokens: no step waits for its own draft,
    every one overlaps, and every row stays Vanilla's."""
    reference = plain(tiny_target, requests_for(tiny_target))
    engine = Engine(tiny_target, "adaflash", drafter_for("adaflash", tiny_target),
                    config=EngineConfig(max_batch=3, max_len=512, pad_shapes=True, length_policy="cost"))
    rule = engine._cost_rule()
    record = rule.record
    # a step's cost grows with its width (as at 8B, batch 64): shorter verifies pay
    monkeypatch.setattr(rule, "record", lambda batch, width, seconds, rows=None, plan=None: record(batch, width, 0.01 * width,
                                                                                               rows, plan))
    chosen, land, drafts, launch, whole_blocks = [], engine._land, rule.drafts, engine._launch, rule.whole_blocks
    between, decided = [False], {True: 0, False: 0}  # whether the host is between a read and the next launch

    def reads(pred, k):
        chosen.append(pred.tolist())
        return drafts(pred, k)

    def landed():
        flight = engine._flight
        out = land()
        between[0] = out is not None
        if flight is not None and flight.predicted:  # the rows keep them after the next launch (`keep_levels`)
            assert out.levels is not None and all(0 < level < PREDICTION_SCALE for level in out.levels.tolist())
        return out

    def launched(*args, **kwargs):
        between[0] = False
        return launch(*args, **kwargs)

    def weighs(batch):
        decided[between[0]] += 1
        return whole_blocks(batch)

    monkeypatch.setattr(rule, "drafts", reads)
    monkeypatch.setattr(rule, "whole_blocks", weighs)
    monkeypatch.setattr(engine, "_land", landed)
    monkeypatch.setattr(engine, "_launch", launched)
    monkeypatch.setattr(engine, "_draft_then_verify", lambda *a, **k: pytest.fail("a step waited for its own draft"))
    outputs = engine.generate(requests_for(tiny_target))
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    assert engine.step_counts["choose"] > engine.step_counts["whole"] > 0
    widths = {w for (_, w), seen in rule.samples.items() if seen}
    assert widths == set(rule.widths())  # every width was timed, in overlapped steps
    # the head's own predictions (in (0, 1)) steered the widths, once the rows had brought one back
    assert any(all(0 < p < 1 for p in pred) for pred in chosen)
    # the rule weighs its modes after a launch, while the device runs; between a read and the launch only
    # where the batch's bucket changed since (here 3 rows and 2, as rows end and others join)
    assert decided[False] > 50 and decided[True] <= decided[False] / 5


@pytest.mark.parametrize("method", ["vanilla", "dflash"])
def test_rows_stopped_by_tokens_end_as_without_overlap(tiny_target, method, monkeypatch):
    """Which rows step again is found over the batch at once (`Landed.next_rows`): rows that stop at the
    target's eos ids, at their own stop tokens, or at nothing, side by side, must end where the plain engine
    ends them, with the same tokens. The eos id and the stop tokens are tokens the answers really give."""
    from dataclasses import replace

    free = {o.rid: o.output_ids for o in plain(tiny_target, requests_for(tiny_target)).values()}
    monkeypatch.setattr(tiny_target, "eos_ids", [free["r1"][5]])
    requests = []
    for i, request in enumerate(requests_for(tiny_target)):
        kind = i % 3  # 0: own stop tokens, 1: eos, 2: none
        params = replace(request.params, ignore_eos=kind != 1,
                         stop_token_ids=[free[request.rid][3 + i % 4]] if kind == 0 else [])
        requests.append(replace(request, params=params))
    reference = plain(tiny_target, requests)
    engine = overlapped(tiny_target, method, padded=True)
    stepped, launch, decode = Counter(), engine._launch, engine._decode

    def spy_launch(rows, *plan):
        stepped.update(s.request.rid for s in rows.seqs)
        return launch(rows, *plan)

    def spy_decode(seqs, chooser):
        stepped.update(s.request.rid for s in seqs)
        return decode(seqs, chooser)

    monkeypatch.setattr(engine, "_launch", spy_launch)
    monkeypatch.setattr(engine, "_decode", spy_decode)
    outputs = engine.generate(requests)
    assert {o.rid: o.output_ids for o in outputs} == {rid: o.output_ids for rid, o in reference.items()}
    # no row stepped past its end: each step it was launched into is one it took (the prefill is the first)
    assert stepped == {o.rid: o.meta_info["spec_verify_ct"] - 1 for o in outputs}
    assert [o.meta_info["finish_reason"] for o in outputs] == [reference[o.rid].meta_info["finish_reason"]
                                                               for o in outputs]
    stopped = [o for o in outputs if o.meta_info["finish_reason"]["type"] == "stop"]
    assert len(stopped) >= 4  # rows of both stopping kinds ended early
