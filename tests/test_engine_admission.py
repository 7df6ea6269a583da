"""Admissions: a wide one is split to the prefill token budget, with the same outputs."""

from __future__ import annotations

import pytest

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from tests.test_engine_lossless import drafter_for
from tests.test_engine_overlap import requests_for


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
