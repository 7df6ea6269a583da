"""Every method returns exactly the target's tokens; stops, eos and max tokens are exact."""

from __future__ import annotations

import pytest
import torch

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.models.drafter_io import new_drafter
from adaflash.models.drafters import Drafter
from adaflash.models.layers import Attention

PROMPTS = ["What is 2+3?", "Write a haiku about the sea.", "List three prime numbers.",
           "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"]
METHOD_DRAFTER = {"dflash": "dflash", "osd": "dflash", "adaflash": "dflash", "eagle3": "eagle3", "mtp": "mtp"}


def make_requests(target, n=None, *, prompts=PROMPTS, **params):
    """The first `n` of `prompts` (all by default), chat-rendered, rids r0, r1, ..."""
    params.setdefault("max_new_tokens", 20)
    return [Request(target.encode(target.render(p)), SamplingParams(**params), rid=f"r{i}")
            for i, p in enumerate(prompts[:n])]


def drafter_for(method, target, **kw):
    return new_drafter(METHOD_DRAFTER[method], target.model.cfg, layers=1, block_size=kw.pop("block_size", 8),
                       length_head=method == "adaflash", steps=kw.pop("steps", 4), **kw)


class OracleDrafter(Drafter):
    """Proposes the known greedy continuation, corrupted at random: exercises every accept length."""

    kind = "block"
    method = "dflash"
    predicts_length = True  # a random ratio per row, as a length head would give

    def __init__(self, cfg, refs: list[list[int]], block_size=8, error_rate=0.25, seed=0):
        super().__init__(cfg, [0], block_size)
        self.refs = refs
        self.error_rate = error_rate
        self.gen = torch.Generator().manual_seed(seed)
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.engine = None

    @property
    def num_cache_layers(self):
        return 1

    def extend(self, *args, **kw):
        pass

    def draft(self, cache, rows, pending, lens, target, ctx_len, steps=None, predict_length=True):
        out = []
        for row, length in zip(rows.tolist(), lens.tolist()):
            seq = self.engine.tokens[row, : length + 1].tolist()
            # padding rows (the scratch slot of a padded batch) match no reference: propose zeros
            ref = next((r for r in self.refs if r[: length + 1] == seq), [0] * (length + self.block_size + 1))
            proposal = (ref[length + 1: length + self.block_size] + [0] * self.block_size)[: self.block_size - 1]
            for i in range(len(proposal)):
                if torch.rand(1, generator=self.gen).item() < self.error_rate:
                    proposal[i] = (proposal[i] + 1) % 1000
            out.append(proposal)
        lengths = torch.rand(len(out), generator=self.gen)
        return torch.tensor(out, device=lens.device), lengths if predict_length else None


def stepwise(engine: Engine, requests: list[Request], after_step, done: dict | None = None) -> dict:
    """Step `engine` through `requests`, calling `after_step()` after each step; finished outputs by rid
    (into `done`, when given, so `after_step` can see them)."""
    done = {} if done is None else done
    for request in requests:
        engine.add(request)
    while engine.has_work():
        for event in engine.step():
            if event.output is not None:
                done[event.rid] = event.output
        after_step()
    return done


def generate_with_swap(engine, requests, drafter, version, at_step=3):
    """Run requests step by step, hot-swapping to `drafter` after `at_step` steps; outputs by rid."""
    steps = 0

    def after_step():
        nonlocal steps
        steps += 1
        if steps == at_step:
            engine.swap_drafter(drafter, version=version)

    return stepwise(engine, requests, after_step)


def vanilla(target, requests):
    return Engine(target, "vanilla",
                  config=EngineConfig(max_batch=len(requests), max_len=512)).generate(requests)


def oracle_engine(target, requests, reference, method="dflash", **kw):
    refs = [r.prompt_ids + o.output_ids + [0] * 32 for r, o in zip(requests, reference)]
    drafter = OracleDrafter(target.model.cfg, refs, **kw)
    engine = Engine(target, method, drafter, config=EngineConfig(max_batch=len(requests), max_len=512))
    drafter.engine = engine
    return engine


@pytest.mark.parametrize("method", ["dflash", "adaflash", "osd", "eagle3", "mtp"])
@pytest.mark.parametrize("batch", [1, 4])
def test_untrained_drafters_are_lossless_on_tiny(tiny_target, method, batch):
    reference = vanilla(tiny_target, make_requests(tiny_target))
    engine = Engine(tiny_target, method, drafter_for(method, tiny_target),
                    config=EngineConfig(max_batch=batch, max_len=512))
    outputs = engine.generate(make_requests(tiny_target))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    for out in outputs:
        meta = out.meta_info
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
        assert sum(meta["spec_accept_histogram"]) == meta["spec_verify_ct"] - 1


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_untrained_drafters_are_lossless_on_smollm2(smollm2_target, method):
    requests = make_requests(smollm2_target, n=2, max_new_tokens=16)
    reference = vanilla(smollm2_target, requests)
    engine = Engine(smollm2_target, method, drafter_for(method, smollm2_target),
                    config=EngineConfig(max_batch=2, max_len=512))
    outputs = engine.generate(make_requests(smollm2_target, n=2, max_new_tokens=16))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]


def test_the_shipped_drafters_are_lossless_and_trained_on_smollm2(smollm2_target):
    """The built-in drafters on their target: the target's own tokens, and drafts it accepts (an untrained
    drafter's τ is about 1): the general one, which dflash and adaflash run by default, on math and on code,
    and the GSM8K specialist on math."""
    from adaflash.engine.build import build_engine
    from adaflash.models.builtin_drafters import builtin_drafter_of
    from tests.test_invariant_kernels import GSM8K_LIKE

    code = ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
            "Write a Python function is_palindrome(s) that ignores case and spaces."]

    def requests(prompts):
        return make_requests(smollm2_target, 2, prompts=prompts, max_new_tokens=32, ignore_eos=True)

    general = builtin_drafter_of("smollm2-135m", "dflash")  # the fixture's target is a folder, not the name
    assert general == builtin_drafter_of("smollm2-135m", "adaflash") == "smollm2-135m-general"
    tau = {}
    for name, prompts in (("math", GSM8K_LIKE), ("code", code)):
        reference = [o.output_ids for o in vanilla(smollm2_target, requests(prompts))]
        runs = [("dflash", general), ("adaflash", general)] + ([("dflash", "smollm2-135m-dflash")] if name == "math" else [])
        for method, draft in runs:
            outputs = build_engine(smollm2_target, method, draft,
                                   config=EngineConfig(max_batch=2, max_len=512)).generate(requests(prompts))
            assert [o.output_ids for o in outputs] == reference, (name, method, draft)
            tau[(name, method, draft)] = sum(o.meta_info["spec_accept_length"] for o in outputs) / len(outputs)
    assert all(t > 1.3 for t in tau.values()), tau


@pytest.mark.parametrize("method", ["dflash", "adaflash"])
def test_accepted_drafts_keep_output_identical(tiny_target, method):
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    engine = oracle_engine(tiny_target, make_requests(tiny_target), reference, method)
    outputs = engine.generate(make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    hist = [0] * 8
    for out in outputs:
        for accepted, count in enumerate(out.meta_info["spec_accept_histogram"]):
            hist[accepted] += count
    assert sum(1 for n in hist[2:] if n) >= 2, f"accept lengths should vary, histogram {hist}"
    assert all(o.meta_info["spec_accept_length"] > 1.3 for o in outputs)


def test_stop_token_mid_block_is_exact(tiny_target):
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=30, ignore_eos=True))
    stop_token = reference[0].output_ids[9]
    first = reference[0].output_ids.index(stop_token)
    requests = make_requests(tiny_target, n=1, max_new_tokens=30, ignore_eos=True, stop_token_ids=[stop_token])
    engine = oracle_engine(tiny_target, requests, reference[:1], error_rate=0.0)
    out = engine.generate(requests)[0]
    assert out.output_ids == reference[0].output_ids[: first + 1]
    assert out.meta_info["finish_reason"] == {"type": "stop", "matched": stop_token}


def test_stop_string_mid_block_is_exact(smollm2_target):
    requests = make_requests(smollm2_target, n=1, max_new_tokens=30, ignore_eos=True)
    reference = vanilla(smollm2_target, requests)
    text = reference[0].text
    stop = text[len(text) // 2: len(text) // 2 + 4]
    assert stop.strip(), text
    cut = text.index(stop)
    requests = make_requests(smollm2_target, n=1, max_new_tokens=30, ignore_eos=True, stop=[stop])
    engine = oracle_engine(smollm2_target, requests, reference, error_rate=0.0)
    out = engine.generate(requests)[0]
    assert out.text == text[:cut]
    assert out.meta_info["finish_reason"] == {"type": "stop", "matched": stop}
    # no token past the one that completed the stop string
    assert stop in smollm2_target.decode(out.output_ids)
    assert stop not in smollm2_target.decode(out.output_ids[:-1])


@pytest.mark.parametrize("method", ["vanilla", "dflash", "eagle3"])
def test_max_new_tokens_is_exact(tiny_target, method):
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter, config=EngineConfig(max_batch=4, max_len=512))
    for n in (1, 7, 13):
        outputs = engine.generate(make_requests(tiny_target, max_new_tokens=n, ignore_eos=True))
        assert all(o.meta_info["completion_tokens"] == n for o in outputs)
        assert all(o.meta_info["finish_reason"] == {"type": "length", "length": n} for o in outputs)


def test_hot_swap_mid_generation_keeps_output(tiny_target):
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=24, ignore_eos=True))
    engine = Engine(tiny_target, "dflash", drafter_for("dflash", tiny_target, seed=1),
                    config=EngineConfig(max_batch=4, max_len=512))
    done = generate_with_swap(engine, make_requests(tiny_target, max_new_tokens=24, ignore_eos=True),
                              drafter_for("dflash", tiny_target, seed=2), version=7)
    assert [done[f"r{i}"].output_ids for i in range(4)] == [o.output_ids for o in reference]
    assert engine.drafter_version == 7
    with pytest.raises(ValueError, match="does not match"):
        engine.swap_drafter(drafter_for("eagle3", tiny_target))


@pytest.mark.parametrize("method, qk_norm", [("dflash", False), ("dflash", True), ("eagle3", False)])
def test_an_installed_drafter_runs_fused_and_a_swap_fills_its_fused_weights(tiny_target, method, qk_norm):
    """The engine fuses a drafter's projections (one GEMM for q/k/v, one for gate/up) without changing what
    it computes or its state_dict, and a hot swap's weights land in the fused tensors."""
    import copy
    import dataclasses

    cfg = dataclasses.replace(tiny_target.model.cfg, qk_norm=qk_norm)
    make = lambda seed: new_drafter(METHOD_DRAFTER[method], cfg, layers=1, block_size=8,  # noqa: E731
                                    length_head=False, steps=4, seed=seed)
    drafter = make(1)
    plain = copy.deepcopy(drafter)
    keys = {k: v.shape for k, v in drafter.state_dict().items()}
    engine = Engine(tiny_target, method, drafter, config=EngineConfig(max_batch=2, max_len=256))
    attns = [m for m in engine.drafter.modules() if isinstance(m, Attention)]
    assert attns and all(a.qkv is not None for a in attns)
    assert {k: v.shape for k, v in engine.drafter.state_dict().items()} == keys
    x = torch.randn(2, 3, attns[0].q_proj.in_features)
    rope = engine.drafter.rotary(torch.arange(3).expand(2, 3), x.dtype)
    plain_attn = next(m for m in plain.modules() if isinstance(m, Attention))
    fused_outs = (*attns[0].project_qkv(x, rope), *attns[0].project_kv(x, rope))
    plain_outs = (*plain_attn.project_qkv(x, rope), *plain_attn.project_kv(x, rope))
    for fused_out, plain_out in zip(fused_outs, plain_outs, strict=True):
        torch.testing.assert_close(fused_out, plain_out, atol=1e-5, rtol=1e-5)
    other = make(2)
    engine.swap_drafter(other, version=3)
    other_attn = next(m for m in other.modules() if isinstance(m, Attention))
    expected = torch.cat([other_attn.q_proj.weight, other_attn.k_proj.weight, other_attn.v_proj.weight])
    assert torch.equal(attns[0].qkv[0], expected)


def test_sampling_matches_the_target_distribution(tiny_target):
    """With T > 0 the first two tokens follow the target's exact joint distribution."""
    params = {"max_new_tokens": 2, "temperature": 0.7, "top_k": 3, "ignore_eos": True}
    prompt = tiny_target.encode(tiny_target.render(PROMPTS[0]))
    from adaflash.engine.sampling import probabilities

    model = tiny_target.model

    def dist(ids):
        cache = model.new_cache(1, 64)
        logits, _ = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, torch.tensor([0]))
        return probabilities(logits[:, -1], torch.tensor([0.7]), torch.tensor([1.0]), torch.tensor([3]))[0]

    p1 = dist(prompt)
    exact = {}
    for a in p1.nonzero().flatten().tolist():
        p2 = dist(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            exact[(a, b)] = float(p1[a] * p2[b])
    n = 600
    best = max(exact, key=exact.get)

    class LikelyDrafter(OracleDrafter):
        """Always proposes the most likely second token: accepted sometimes, rejected sometimes."""

        def draft(self, cache, rows, pending, lens, target, ctx_len, steps=None, predict_length=True):
            return torch.tensor([[best[1], 0, 0]] * len(rows)), None

    drafter = LikelyDrafter(model.cfg, [], block_size=4)
    engine = Engine(tiny_target, "dflash", drafter, config=EngineConfig(max_batch=100, max_len=128, seed=3))
    outputs = engine.generate([Request(prompt, SamplingParams(**params)) for _ in range(n)])
    counts: dict[tuple[int, int], int] = {}
    for out in outputs:
        key = tuple(out.output_ids)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < 0.08, (tv, counts, exact)
    assert any(o.meta_info["spec_num_correct_drafts"] for o in outputs), "some drafts must be accepted"


def test_cache_reads_consecutive_slots_as_a_view_and_others_as_a_copy():
    """Consecutive slots (a full batch) read without copying; any other rows gather the same values."""
    from adaflash.models.cache import KVCache

    cache = KVCache(2, 6, 16, 2, 4)
    cache.k.normal_()
    cache.v.normal_()
    k, v = cache.read(1, torch.tensor([2, 3, 4]), 5)
    assert k.data_ptr() == cache.k[1, 2].data_ptr() and torch.equal(v, cache.v[1, 2:5, :5])
    k, v = cache.read(1, torch.tensor([4, 2]), 5)
    assert torch.equal(k, cache.k[1, [4, 2], :5]) and torch.equal(v, cache.v[1, [4, 2], :5])


def test_cache_reads_rows_in_order_as_views_and_refuses_other_rows():
    """`in_order` (set around a pass over slots 0..b-1) reads views on any device; on a CPU it checks the
    rows, so an engine that set it for other rows fails here instead of reading the wrong slots."""
    from adaflash.models.cache import KVCache

    cache = KVCache(2, 6, 16, 2, 4)
    cache.k.normal_()
    cache.in_order = True
    k, v = cache.read(0, torch.tensor([0, 1, 2, 3]), 7)
    assert k.data_ptr() == cache.k[0].data_ptr() and k.shape == (4, 7, 2, 4)
    with pytest.raises(RuntimeError, match=r"rows are \[1, 2\], not 0..b-1"):
        cache.read(0, torch.tensor([1, 2]), 7)


def test_cache_writes_land_at_each_rows_positions_after_growth():
    """Flat write indices address (slot, position) pairs, and are taken after `reserve` grows the cache."""
    from adaflash.models.cache import KVCache

    cache = KVCache(2, 4, 1024, 2, 4)
    rows, positions = torch.tensor([3, 1]), torch.tensor([[300, 301], [5, 6]])
    cache.reserve(302)  # past the first capacity: the layout changes
    k, v = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    cache.write(1, cache.where(rows, positions), k, v)
    assert torch.equal(cache.k[1, 3, 300:302], k[0]) and torch.equal(cache.v[1, 1, 5:7], v[1])
    assert cache.k[0].abs().sum() == 0 and cache.k[1, 3, :300].abs().sum() == 0  # nothing else written


def test_busy_engine_admits_prompts_in_groups_and_keeps_outputs(tiny_target):
    """With admit_batch 2 a full engine waits for two free slots before it prefills again."""
    requests = lambda: [Request(r.prompt_ids, SamplingParams(max_new_tokens=6 + 5 * i, ignore_eos=True), rid=r.rid)  # noqa: E731
                        for i, r in enumerate(make_requests(tiny_target) * 2)]
    reference = Engine(tiny_target, "vanilla",
                       config=EngineConfig(max_batch=1, max_len=512)).generate(requests())
    engine = Engine(tiny_target, "dflash", drafter_for("dflash", tiny_target),
                    config=EngineConfig(max_batch=3, max_len=512, admit_batch=2))
    admitted: list[tuple[int, int]] = []  # (prompts admitted, rows decoding at that moment)
    passes: list[int] = []  # prompts in each prefill pass
    take, prefill = engine._admitted, engine.passes.prefill
    engine._admitted = lambda: (found := take(), admitted.append((len(found), len(engine.active))))[0]
    engine.passes.prefill = lambda ids, rows, length: (passes.append(ids.shape[0]), prefill(ids, rows, length))[1]
    outputs = engine.generate(requests())
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert admitted[0] == (3, 0)  # an idle engine fills every slot at once
    assert all(3 - busy >= 2 for _, busy in admitted[1:]), admitted  # two slots free at every later prefill
    assert any(n == 2 for n, _ in admitted[1:]), admitted  # and prompts admitted together
    assert sum(n for n, _ in admitted) == 8
    assert passes == [1] * 8  # on a CPU each prompt prefills alone: its bits whatever arrives with it


def test_admit_batch_defaults_to_an_eighth_of_a_padded_batch(tiny_target):
    assert Engine(tiny_target, "vanilla",
                  config=EngineConfig(max_batch=32, max_len=256, pad_shapes=True)).admit_batch == 4
    assert Engine(tiny_target, "vanilla",
                  config=EngineConfig(max_batch=32, max_len=256)).admit_batch == 1  # CPU: exact shapes
    with pytest.raises(ValueError, match="admit_batch must be an integer >= 1"):
        Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=4, max_len=256, admit_batch=0))


def test_a_dflash_block_attends_in_the_cache_as_over_its_context_and_block(tiny_target):
    """The engine's block keys go into the drafter cache after each row's context (no copy of the
    context a layer); rows of other lengths and stale keys past them must not change a row's hidden
    states from those of the block attending to [its context, the block] alone, as in training."""
    model = tiny_target.model
    drafter = drafter_for("dflash", tiny_target, block_size=4).eval()
    cache = drafter.new_cache(3, 64)
    cache.k.normal_()  # stale keys and values everywhere, past every row's context included
    cache.v.normal_()
    lens = torch.tensor([5, 9, 1])
    rows = torch.tensor([2, 0, 1])
    feats = torch.randn(3, 9, drafter.feature_size)
    with torch.no_grad():
        positions = torch.arange(9).expand(3, 9)
        drafter.extend(cache, rows, positions, feats, torch.zeros(3, 9, dtype=torch.long), lens, model, 9)
        pending = torch.tensor([7, 3, 11])
        hidden = drafter.block_hidden(cache, rows, pending, lens, model, 16)
        for i in range(3):
            n = int(lens[i])
            ctx_kv = drafter.context_kv(drafter.context(feats[i : i + 1, :n]), torch.arange(n)[None])
            h = torch.cat([model.embed(pending[i : i + 1])[:, None], drafter.mask_embeds(model, (1, 3))], dim=1)
            ref = drafter.run_block(h, n + torch.arange(4)[None], ctx_kv, torch.ones(1, 4, n + 4, dtype=torch.bool))
            torch.testing.assert_close(hidden[i : i + 1], ref, rtol=1e-5, atol=1e-5)
