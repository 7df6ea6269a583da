"""Seeded sampling (each token fixed by the seed and its position) and min-p, in the sampler and the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaflash.engine.config import EngineConfig

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "Colors of the rainbow:"]
MAX_NEW = 8


def test_inverse_cdf_draws_the_token_whose_interval_holds_u_and_never_a_masked_one():
    from adaflash.engine.sampling import inverse_cdf

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 4)
    u = torch.tensor([1e-12, 0.2499, 0.2501, 1 - 1e-12], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3]


def test_min_p_drops_tokens_below_its_share_of_the_likeliest():
    from adaflash.engine.sampling import probabilities

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    one = torch.ones(1)
    kept = probabilities(logits, one, one, torch.tensor([-1]), torch.tensor([0.2]))  # floor 0.1
    assert kept[0, 3] == 0 and torch.allclose(kept[0, :3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)
    assert torch.allclose(probabilities(logits, one, one, torch.tensor([-1])), logits.exp())


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_sampling_seed")


@pytest.fixture(scope="module")
def engines(tiny_llama: Path, tmp_path_factory):
    from adaflash.engine.build import build_engine
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.models.loading import load_target

    target = load_target(str(tiny_llama), device="cpu")
    draft = save_drafter(new_drafter("dflash", target.model.cfg, seed=3), tmp_path_factory.mktemp("d") / "draft")
    vanilla = build_engine(str(tiny_llama), "vanilla", None,
                           config=EngineConfig(max_batch=4, max_len=128, seed=1), device="cpu")
    dflash = build_engine(str(tiny_llama), "dflash", str(draft),
                          config=EngineConfig(max_batch=4, max_len=128, seed=2), device="cpu")
    return target, vanilla, dflash


def _run(engine, target, specs: list[tuple[str, dict]]) -> list[list[int]]:
    from adaflash.engine.params import Request, SamplingParams

    requests = [Request(target.encode(p), SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True, **kw))
                for p, kw in specs]
    return [o.output_ids for o in engine.generate(requests)]


def test_a_seeded_answer_is_the_same_alone_in_any_batch_and_with_any_method(engines):
    target, vanilla, dflash = engines
    seeded = {"temperature": 1.0, "seed": 1234}
    alone = _run(vanilla, target, [(PROMPTS[0], seeded)])[0]
    crowd = [(PROMPTS[1], {"temperature": 1.0}), (PROMPTS[2], {}), (PROMPTS[0], seeded),
             (PROMPTS[3], {"temperature": 0.7, "seed": 9})]
    assert _run(vanilla, target, crowd)[2] == alone
    assert _run(dflash, target, crowd)[2] == alone  # speculative: the same token at every position
    assert _run(dflash, target, [(PROMPTS[0], seeded)])[0] == alone
    others = {tuple(_run(vanilla, target, [(PROMPTS[0], {"temperature": 1.0, "seed": s})])[0]) for s in range(3)}
    assert len(others) > 1  # the seed matters


def test_greedy_ignores_seed_and_min_p(engines):
    target, vanilla, dflash = engines
    plain = _run(vanilla, target, [(p, {}) for p in PROMPTS])
    assert _run(vanilla, target, [(p, {"seed": 5, "min_p": 0.3}) for p in PROMPTS]) == plain
    assert _run(dflash, target, [(p, {"seed": 5, "min_p": 0.3}) for p in PROMPTS]) == plain


def test_min_p_one_samples_only_the_likeliest_token(engines):
    target, vanilla, _ = engines
    greedy = _run(vanilla, target, [(PROMPTS[1], {})])[0]
    assert _run(vanilla, target, [(PROMPTS[1], {"temperature": 1.5, "min_p": 1.0})])[0] == greedy
