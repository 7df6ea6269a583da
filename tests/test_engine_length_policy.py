"""AdaFlash's verify-length rules: the design's rate rule and the measured-cost rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.length_policy import CostRule
from adaflash.engine.params import Request, SamplingParams
from tests.test_engine_lossless import make_requests, oracle_engine, vanilla


def trained(rule: CostRule, batch: int, seconds) -> CostRule:
    """Feed every width its tries at the given cost (a function of the width)."""
    while (width := rule.probe(batch)) is not None:
        rule.record(batch, width, seconds(width))
    return rule


def test_probes_every_width_its_tries_before_choosing():
    rule = CostRule(block=4, min_length=2, tries=2)
    chosen = []
    for _ in range(6):
        n = int(rule.choose(torch.tensor([0.9]), k=3)[0])
        chosen.append(n + 1)
        rule.record(1, n + 1, 1.0)
    assert chosen == [2, 3, 4, 2, 3, 4]  # round robin: a drift of the machine moves every width alike
    assert rule.cost(1) == {2: 1.0, 3: 1.0, 4: 1.0}
    assert rule.cost(2) is None and rule.probe(2) == 2  # each batch size learns its own costs ...
    trained(rule, 3, lambda w: 2.0)
    assert rule.cost(4) == {2: 2.0, 3: 2.0, 4: 2.0}  # ... by power of two: 3 and 4 rows share theirs


def test_flat_cost_verifies_the_whole_block_and_steep_cost_follows_the_prediction():
    preds = torch.tensor([0.3, 0.6, 0.95])  # predicted tokens per full-block step: 2.4, 4.8, 7.6 of 8
    flat = trained(CostRule(block=8, min_length=2), 3, lambda w: 1.0)
    assert flat.whole_block_cheapest(3) and flat.choose(preds, k=7) is None  # all of it, prediction unread
    within = trained(CostRule(block=8, min_length=2, slack=0.02), 3, lambda w: 1.0 + 0.001 * w)
    assert within.choose(preds, k=7) is None  # dearer by less than the slack: still the whole block
    beyond = trained(CostRule(block=8, min_length=2, slack=0.0), 3, lambda w: 1.0 + 0.001 * w)
    assert not beyond.whole_block_cheapest(3) and beyond.choose(preds, k=7).tolist() == [7, 7, 7]
    steep = trained(CostRule(block=8, min_length=2), 1, lambda w: 1.0 + 0.5 * w)
    alone = [int(steep.choose(pred[None], k=7)) for pred in preds]
    assert alone == sorted(alone) and alone[0] <= 2 and alone[-1] == 7  # more expected acceptance, longer verify
    trained(steep, 3, lambda w: 1.0 + 0.5 * w)
    together = steep.choose(preds, k=7).tolist()  # a batch verifies one width, weighed by all its rows
    assert len(set(together)) == 1 and alone[0] < together[0] <= alone[-1]
    assert trained(CostRule(block=8, min_length=3), 1, lambda w: w).choose(torch.tensor([0.1]), k=7).item() == 2


def test_refresh_retries_the_stalest_width():
    rule = trained(CostRule(block=4, min_length=2, tries=1, refresh=5), 1, lambda w: 1.0)
    rule.record(1, 4, 1.0)
    rule.record(1, 3, 1.0)  # 5 steps so far; width 2 was measured longest ago
    assert rule.steps % rule.refresh == 0 and rule.probe(1) == 2


@pytest.mark.parametrize("choose_seconds, whole_seconds, expected", [(1.0, 0.8, True), (0.75, 0.9, False)])
def test_modes_are_weighed_by_the_tokens_per_second_they_yield(choose_seconds, whole_seconds, expected):
    """Per-width timings favour short verifies, but steps that verify whole blocks unread may still yield
    more tokens per second (a GPU drafts inside the step then): the rule weighs the head's steps against
    what whole blocks would have made of them in a whole-block step's time, trying each mode first, then
    the other one ever less often while the better one holds."""
    rule = trained(CostRule(block=4, min_length=2, tries=1, refresh=64, mode_tries=4), 1, lambda w: 0.5 + 0.1 * w)
    assert not rule.whole_block_cheapest(1)
    modes = []
    for _ in range(600):
        whole = rule.whole_blocks(1)
        modes.append(whole)
        # a head-read step verifies 2 drafts and rejects the first: whole blocks would have given the same token
        rule.record(1, 4 if whole else 3, whole_seconds if whole else choose_seconds, rows=[(0, 3 if whole else 2)])
    assert not rule.whole_block_cheapest(1)  # width 2 stays the cheapest in the table
    assert modes[:4] == [False] * 4 and modes[4] is True  # the head's choice tried first, then a whole block
    others = [i for i, whole in enumerate(modes[5:], start=5) if whole != expected]
    # retries 32, 96, 224, 480 steps after the better mode settled (at step 5); while whole blocks win,
    # the stalest width is also re-timed (a head-read step) after 8 x 64 steps
    assert others == [37, 101, 229, 485] + ([517] if expected else [])
    assert rule.mode_rate(1, "choose") == pytest.approx(1 / choose_seconds)
    assert rule.mode_rate(1, "whole") == pytest.approx(1 / whole_seconds)
    assert rule.mode_rate(2, "whole") is None  # each batch bucket weighs its own


def test_whole_blocks_are_weighed_on_the_head_read_steps_own_prompts():
    """Acceptance swings from prompt to prompt far more than a width moves it: here every head-read step
    meets an easy stretch (all its drafts accepted) and every whole-block step a hard one (none). Their own
    tokens per second favour the head; weighed on the same steps, whole blocks would have given those
    tokens and more in less time (1.05 s against 1.25 s), and win."""
    rule = trained(CostRule(block=8, min_length=2, tries=1, refresh=0, mode_tries=4), 1, lambda w: 1.0 + 0.01 * w)
    modes, choose_tokens = [], []
    for _ in range(40):
        whole = rule.whole_blocks(1)
        modes.append(whole)
        if whole:
            rule.record(1, 8, 1.05, rows=[(0, 7)])
        else:
            verified = int(rule.choose(torch.tensor([0.5]), k=7)[0])
            choose_tokens.append(verified + 1)
            rule.record(1, verified + 1, 1.25, rows=[(verified, verified)])
    assert not rule.whole_block_cheapest(1)
    assert modes[:4] == [False] * 4 and all(modes[4:])
    assert min(choose_tokens) / 1.25 > 1 / 1.05  # what each mode's own steps yielded favours the head
    assert rule.mode_rate(1, "whole") > rule.mode_rate(1, "choose") * 1.25 / 1.05


def test_tokens_past_the_width_are_expected_geometrically():
    """A head-read step whose row accepted all 3 drafts it verified, of a block of 8 at acceptance ½, would
    have given ½ + ¼ + ⅛ + 1/16 tokens more verifying the whole block; a row that rejected one, none."""
    rule = trained(CostRule(block=8, min_length=2, tries=1, refresh=0, mode_tries=1), 2, lambda w: 0.5 + 0.1 * w)
    assert not rule.whole_blocks(2) and rule.planned == "choose"
    full_block = (1 - 0.5 ** 8) / (1 - 0.5)  # E_8 at acceptance ½: the head predicts it as a share of 8
    verified = rule.choose(torch.tensor([full_block / 8] * 2), k=7)
    rule.record(2, int(verified[0]) + 1, 1.0, rows=[(3, 3), (1, 3)])
    assert list(rule.choose_steps[2]) == [(rule.steps, 6, 1.0, pytest.approx(6 + 0.9375, abs=2e-3))]


def test_a_change_of_the_better_mode_restarts_the_retries():
    rule = trained(CostRule(block=4, min_length=2, tries=1, window=1, refresh=8, mode_tries=2, mode_window=2), 1,
                   lambda w: 0.5 + 0.1 * w)
    seconds = {True: 0.75, False: 0.8}  # neither the cheapest width in the table (width 2: 0.7)
    modes = []
    for step in range(120):
        if step == 60:
            seconds = {True: 4.0, False: 1.0}  # whole blocks now cost more: the head's choice becomes better
        whole = rule.whole_blocks(1)
        modes.append(whole)
        rule.record(1, 4 if whole else 3, seconds[whole], rows=[(0, 3 if whole else 2)])
    # from step 61 the head's choice is the better mode: whole blocks come back only as its retries,
    # 4, 12 and 28 steps (½, 1½, 3½ periods of 8) after the change
    assert [i for i in range(60, 120) if modes[i]] == [60, 65, 73, 89]


@pytest.mark.parametrize("horizon, recovers", [(256, True), (10**9, False)])
def test_a_slow_stretch_on_whole_block_steps_does_not_hold_the_head_choosing(horizon, recovers):
    """Whole blocks are the better mode (0.8 s a step against the head's 1.0) until a slow stretch (12 steps
    three times as long) falls on whole-block steps: the head's choice then looks better and wins.
    Once the stretch is over, whole blocks run only as the head's retries; their times from the stretch
    stop counting after `horizon` steps, and whole blocks win again. Kept for ever, they hold the head."""
    rule = trained(CostRule(block=4, min_length=2, tries=3, refresh=64, mode_tries=4, horizon=horizon), 1,
                   lambda w: 0.5 + 0.1 * w)
    modes = []
    for step in range(900):
        slow = 3.0 if 100 <= step < 112 else 1.0
        whole = rule.whole_blocks(1)
        modes.append(whole)
        rule.record(1, 4 if whole else 3, (0.8 if whole else 1.0) * slow, rows=[(0, 3 if whole else 2)])
    assert all(modes[60:100]) and sum(modes[115:165]) <= 2  # whole blocks, then the head (but for a retry)
    assert (sum(modes[700:]) > 190) is recovers  # whole blocks again, but for the head's retries


def test_head_read_steps_from_a_faster_stretch_are_measured_again_before_they_take_over():
    """The head's choice wins while whole blocks cost 1.0 s (to its 0.5), then whole blocks do (0.4 s)
    and hold. When the machine slows to half its speed, the head's last steps, from the fast stretch,
    still promise more than the whole blocks' fresh ones: the head runs `mode_tries` steps again, which
    show it slower too, and whole blocks keep their place."""
    rule = trained(CostRule(block=4, min_length=2, tries=3, refresh=0, mode_tries=4, horizon=50), 1,
                   lambda w: 0.5 + 0.1 * w)
    modes, better = [], []
    for step in range(300):
        whole_s, choose_s = (1.0, 0.5) if step < 40 else (0.4, 0.5) if step < 150 else (0.8, 1.0)
        whole = rule.whole_blocks(1)
        modes.append(whole)
        better.append(rule._best[1][0] if 1 in rule._best else None)
        rule.record(1, 4 if whole else 3, whole_s if whole else choose_s, rows=[(0, 3 if whole else 2)])
    assert better[20] == "choose" and set(better[100:]) == {"whole"}
    assert 1 <= modes[150:].count(False) <= rule.mode_tries  # measured again, once


@pytest.mark.parametrize("choose_seconds, better", [(0.98, "whole"), (0.95, "choose")])
def test_the_head_takes_over_from_whole_blocks_only_by_a_margin(choose_seconds, better):
    """Whole blocks hold; the head's recent steps yield 2% more tokens per second (within a noisy machine's
    drift): whole blocks stay. 5% more: the head takes over."""
    from collections import deque

    rule = trained(CostRule(block=4, min_length=2, tries=1, mode_tries=4, margin=0.03), 1, lambda w: 0.5 + 0.1 * w)
    now = rule.steps
    rule._best[1] = ("whole", now)
    rule.choose_steps[1] = deque((now, 1, choose_seconds, 1.0) for _ in range(4))
    rule.whole_seconds[1] = deque((now, 1.0) for _ in range(4))
    assert rule._modes(1)[0] == better


def test_while_whole_blocks_hold_the_head_is_read_only_before_its_retries():
    """Whole blocks the better mode (shorter widths cheaper, but their steps yield less): a whole-block step
    brings the head's predictions back only within three steps before a head-read retry, which its width is
    sized from; while the head's choice is the better mode, every step does."""
    from collections import deque

    def run(choose_seconds: float, steps: int = 200) -> tuple[list[str], list[bool]]:
        rule = trained(CostRule(block=4, min_length=2, tries=1, mode_tries=4, refresh=16), 1, lambda w: 0.5 + 0.1 * w)
        rule.choose_steps[1] = deque((rule.steps, 1, choose_seconds, 1.0) for _ in range(4))
        rule.whole_seconds[1] = deque((rule.steps, 1.0) for _ in range(4))
        modes, wanted = [], []
        for _ in range(steps):
            whole = rule.whole_blocks(1)
            modes.append(rule.planned)
            wanted.append(rule.head_wanted)
            width = rule.probe(1) if rule.planned == "probe" else 4 if whole else 2
            if rule.planned == "choose":
                rule.drafts(np.array([0.5]), 3)
            # every step's tokens per second stay as set: retries leave the better mode where it was
            rule.record(1, width, 1.0 if whole else choose_seconds, rows=[(0, width - 1)])
            rule.choose_steps[1] = deque((rule.steps, 1, choose_seconds, 1.0) for _ in range(4))
            rule.whole_seconds[1] = deque((rule.steps, 1.0) for _ in range(4))
        return modes, wanted

    modes, wanted = run(1.5)  # the head's steps yield less: whole blocks hold
    retries = [i for i, mode in enumerate(modes) if mode == "choose"]
    assert retries and modes.count("whole") > 150
    near = {i - d for i in retries for d in (1, 2, 3)}
    assert all(wanted[i] == (i in near or modes[i] != "whole") for i in range(20, len(modes)))
    assert sum(wanted) < 40
    modes, wanted = run(0.5)  # the head's steps yield more: it holds, and every step reads it
    assert modes.count("choose") > 150 and all(wanted[20:])


def test_stale_widths_are_retimed_ever_less_often_while_whole_blocks_win():
    """Each re-timing verifies a shorter width than the step would (and on a GPU may capture a graph on
    the clock): while whole blocks win it comes after 1, 2, 4, ... periods of refresh x whole_backoff
    steps, and once the head's choice pays again, every refresh steps."""
    def probe_steps(cost, steps: int = 512) -> list[int]:
        rule = trained(CostRule(block=4, min_length=2, tries=1, refresh=8, whole_backoff=4, mode_tries=2), 1, cost)
        at = []
        for _ in range(steps):
            whole = rule.whole_blocks(1)
            if rule.planned == "probe":
                at.append(rule.steps)
            width = rule.probe(1) if rule.planned == "probe" else 4 if whole else 2
            rule.record(1, width, cost(width), rows=[(1, width - 1)])
        return at

    flat = probe_steps(lambda w: 1.0)  # whole blocks win from the first decision (after 3 timing tries)
    assert [b - a for a, b in zip(flat, flat[1:])] == [32, 64, 128]
    assert flat[0] - 3 == 32
    steep = probe_steps(lambda w: 0.5 + 0.1 * w)  # the head's choice pays: one try in 8
    assert len(steep) == 512 // 8 and {b - a for a, b in zip(steep, steep[1:])} == {8}


def test_whole_blocks_are_checked_again_within_recheck_steps():
    """The table is read every `recheck` steps while whole blocks win: when the whole block turns dear, the
    head is back within that many steps."""
    rule = trained(CostRule(block=4, min_length=2, tries=1, window=1, recheck=16, refresh=0), 1, lambda w: 1.0)
    for _ in range(5):
        assert rule.whole_blocks(1)
        rule.record(1, 4, 1.0, rows=[(1, 3)])
    rule.record(1, 4, 5.0)  # the whole block now costs 5x the others (window 1: the median is that step)
    decided = []
    for _ in range(20):
        decided.append(rule.whole_blocks(1))
        rule.record(1, 4 if decided[-1] else 2, 5.0 if decided[-1] else 1.0, rows=[(1, 1)])
    assert decided[0] and not decided[-1] and decided.index(False) < 16  # cached a while, then read again


def test_probe_steps_do_not_count_for_a_mode():
    rule = CostRule(block=4, min_length=2, tries=1, mode_tries=1)
    assert not rule.whole_blocks(1)  # width 2 is due for its timing try
    rule.record(1, 2, 1.0, rows=[(1, 1)])
    assert rule.choose_steps == {} and rule.whole_seconds == {}


@pytest.mark.parametrize("batch", [1, 4])
def test_cost_policy_is_lossless_and_learns_the_widths(tiny_target, batch):
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    drafter = oracle_engine(tiny_target, make_requests(tiny_target), reference, "adaflash").drafter
    engine = Engine(tiny_target, "adaflash", drafter,
                    config=EngineConfig(max_batch=batch, max_len=512, length_policy="cost"))
    drafter.engine = engine
    outputs = engine.generate(make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    rule = engine.cost_rule
    assert rule is not None and rule.block == 8
    timed = {width for _, width in rule.samples}
    if batch == 1:
        assert timed == set(rule.widths()) and rule.cost(1) is not None  # every width timed, then chosen by cost
    else:
        assert {2, 3, 4} <= timed  # widths are tried in turn (fewer steps here: 4 rows share each)


def test_unknown_policy_is_refused(tiny_target):
    with pytest.raises(ValueError, match="length_policy must be one of cost, rate"):
        Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=1, max_len=64, length_policy="fast"))


@pytest.mark.parametrize("padded", [False, True])
def test_a_flat_cost_verifies_whole_blocks_through_the_engine(tiny_target, padded):
    """Once the whole block is measured no dearer, every step verifies all of it, losslessly, on the eager
    path and on the padded one a GPU takes."""
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    drafter = oracle_engine(tiny_target, make_requests(tiny_target), reference, "adaflash").drafter
    engine = Engine(tiny_target, "adaflash", drafter,
                    config=EngineConfig(max_batch=1, max_len=512, length_policy="cost", pad_shapes=padded))
    drafter.engine = engine
    block = drafter.block_size
    engine.cost_rule = trained(CostRule(block, engine.min_length, max_batch=1, refresh=0), 1, lambda w: 1.0)
    outputs = engine.generate(make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert engine.cost_rule.cost(1)[block] < 1.0  # the engine's own steps were recorded at the whole width
    assert {width for (_, width), seen in engine.cost_rule.samples.items() if len(seen) > 3} == {block}
    for out in outputs:  # every drafted step proposed the whole block
        assert out.meta_info["spec_num_proposed_drafts"] == sum(out.meta_info["spec_accept_histogram"]) * (block - 1) > 0


def test_smaller_batches_take_whole_blocks_once_a_larger_one_settled_on_them():
    """A run's tail shrinks through every smaller batch bucket: once batch 32 settled on whole blocks,
    smaller buckets verify them too, without timing tries or head-read steps of their own; a bucket with
    its own verdict keeps it, a larger one learns its own, and the inheritance ends when the larger
    bucket stops settling on whole blocks."""
    rule = trained(CostRule(block=4, min_length=2, tries=1, refresh=0, mode_tries=2), 32, lambda w: 1.0)
    assert rule.whole_blocks(32)
    rule.record(32, 4, 1.0, rows=[(1, 3)] * 32)
    for batch in (16, 9, 5, 3, 2, 1):
        assert rule.whole_blocks(batch) and rule.planned == "whole"
        rule.record(batch, 4, 1.0, rows=[(0, 3)] * batch)
    assert rule.cost(16) is None and rule.cost(1) is None  # not one timing try below 32
    assert not rule.whole_blocks(64) and rule.planned == "probe"  # a larger batch times its widths

    own = trained(CostRule(block=4, min_length=2, tries=1, refresh=0), 4, lambda w: 0.5 + 0.5 * w)
    trained(own, 32, lambda w: 1.0)
    assert own.whole_blocks(32) and not own.whole_blocks(4)  # batch 4 measured steep widths itself

    flips = trained(CostRule(block=4, min_length=2, tries=1, refresh=0, recheck=1, window=1), 32, lambda w: 1.0)
    assert flips.whole_blocks(32) and flips.whole_blocks(8)
    flips.record(32, 4, 5.0)  # the whole block turns dear at batch 32: its verdict is read again
    assert not flips.whole_blocks(32)
    assert not flips.whole_blocks(8) and flips.planned == "probe"  # batch 8 now learns its own


def test_the_tail_of_a_run_takes_whole_blocks_without_timing_tries(tiny_target):
    """Through the engine: once batch 4 settled on whole blocks, the rows left as others finish (batch
    buckets 2 and 1) verify whole blocks too, losslessly, with no timing try or head-read step."""
    lengths = [12, 24, 36, 48]
    def requests():
        return [Request(r.prompt_ids, SamplingParams(max_new_tokens=n, ignore_eos=True), rid=r.rid)
                for r, n in zip(make_requests(tiny_target, 4), lengths)]
    reference = vanilla(tiny_target, requests())
    drafter = oracle_engine(tiny_target, requests(), reference, "adaflash").drafter
    engine = Engine(tiny_target, "adaflash", drafter,
                    config=EngineConfig(max_batch=4, max_len=512, length_policy="cost"))
    drafter.engine = engine
    engine.cost_rule = trained(CostRule(drafter.block_size, engine.min_length, max_batch=4, refresh=0), 4,
                               lambda w: 1.0)
    outputs = engine.generate(requests())
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert [len(o.output_ids) for o in outputs] == lengths
    assert set(engine.step_counts) - {"prefill"} == {"whole"}
    assert engine.cost_rule.cost(2) is None and engine.cost_rule.cost(1) is None
    assert set(engine.cost_rule.whole_seconds) == {1, 2, 4}  # every bucket stepped


def test_a_step_sized_ahead_counts_rows_without_a_prediction_as_the_batch_mean(tiny_target, monkeypatch):
    """Rows new to the batch have brought no prediction back yet: they count as the others' mean, and when no
    row has one the step verifies as if every draft were accepted."""
    import numpy as np

    from adaflash.engine.passes import PREDICTION_SCALE
    from tests.test_engine_lossless import drafter_for

    engine = Engine(tiny_target, "adaflash", drafter_for("adaflash", tiny_target),
                    config=EngineConfig(max_batch=4, max_len=256, pad_shapes=True, length_policy="cost"))
    assert engine._sizes_ahead()
    rule = engine.cost_rule = trained(CostRule(8, engine.min_length, max_batch=4, refresh=0), 4, lambda w: w)
    seen = []
    monkeypatch.setattr(rule, "drafts", lambda pred, k: seen.append(pred.tolist()) or 3)
    class Rows:  # the rows' latest predictions, NaN where none came yet (`flight.Rows.levels`)
        def __init__(self, *levels):
            self.levels = np.array([np.nan if level is None else level for level in levels], dtype=np.float64)

        def __len__(self):
            return len(self.levels)

    rows = Rows
    assert engine._ahead_plan(rows(PREDICTION_SCALE // 4, None, PREDICTION_SCALE // 2, None), chooser=len) == (3, True)
    assert engine._ahead_plan(rows(None, None), chooser=len) == (3, True)
    assert seen == [[0.25, 0.375, 0.5, 0.375], [1.0, 1.0]]
    # a step that verifies whole blocks brings predictions back only while the modes are being weighed
    assert engine._ahead_plan(rows(None), chooser=None) == (None, rule.head_wanted)
