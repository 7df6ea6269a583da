"""Batch-invariant kernels (`adaflash.models.invariant`): a row's bits do not depend on how many rows,
queries or keys run beside it, and bf16 speculative decoding on a GPU gives Vanilla's tokens.

On a CPU the kernels run under Triton's interpreter in fp16 (its bf16 dot is not the GPU's); on a GPU
compiled, bf16 and fp16, on SmolLM2's shapes."""

from __future__ import annotations

import pytest
import torch

from adaflash.engine.config import EngineConfig
from tests.json_script import run_json_script

triton = pytest.importorskip("triton")  # the kernel-tests extra installs it; torch's CPU wheels do not
interpreted_loops = pytest.mark.skipif(
    tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 9),
    reason="Triton < 3.9's interpreter cannot loop to a bound passed at run time (numpy >= 2.5)")

CHECKS = r"""
import json, os, sys, torch
import torch.nn.functional as F
from adaflash.models import invariant as inv
from adaflash.models import invariant_attention as att

device, dtype = sys.argv[1], getattr(torch, sys.argv[2])
interpreted = os.environ.get("TRITON_INTERPRET") == "1"
torch.manual_seed(0)
result = {"mm_rows": [], "mm_err": [], "norm_rows": [], "norm_err": [], "attn_rows": [], "attn_err": [], "bool_err": []}
shapes = [(960, 576, True), (576, 1536, False)] if device == "cpu" else [(960, 576, False), (3072, 576, False), (576, 1536, False), (49152, 576, False), (960, 576, True)]
counts = (1, 4, 9) if device == "cpu" else (1, 2, 4, 32, 128, 300)
for n, k, with_bias in shapes:
    w = (torch.randn(n, k, device=device) * 0.05).to(dtype)
    bias = (torch.randn(n, device=device) * 0.1).to(dtype) if with_bias else None
    x = torch.randn(max(counts), k, device=device).to(dtype)
    full = inv.mm(x, w, bias)
    ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    result["mm_err"].append(float(((full.float() - ref).abs() / (ref.abs() + 1)).max()))
    lo = 0 if interpreted else 5  # a 3-D input's rows at their own tile places under numpy (below), moved on a GPU
    result["mm_rows"].append(all(torch.equal(inv.mm(x[:m], w, bias), full[:m]) for m in counts)
                             and torch.equal(inv.mm(x[lo:lo + 4].view(2, 2, k), w, bias).view(4, n), full[lo:lo + 4]))
xs = (torch.randn(300, 576, device=device) * 3).to(dtype)
weight = (torch.rand(576, device=device) + 0.5).to(dtype)
normed = inv.rms_norm(xs, weight, 1e-5)
result["norm_rows"].append(all(torch.equal(inv.rms_norm(xs[:m], weight, 1e-5), normed[:m]) for m in counts))
result["norm_err"].append(float((normed.float() - F.rms_norm(xs.float(), (576,), weight.float(), 1e-5)).abs().max()))
b, heads, kv, d = 3, 9, 3, 64
for queries, length in ((4, 200), (16, 70), (2, 130)):
    s = length + 100  # a bucket wider than any row's context
    q = torch.randn(b, queries, heads, d, device=device).to(dtype)
    k = torch.randn(b, s, kv, d, device=device).to(dtype)
    v = torch.randn(b, s, kv, d, device=device).to(dtype)
    pos = torch.randint(0, length - queries, (b, 1), device=device) + torch.arange(queries, device=device)
    allowed = torch.arange(s, device=device)[None, None, :] <= pos[:, :, None]
    additive = torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    out = att.attention(q, k, v, additive)
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
                                         attn_mask=allowed.unsqueeze(1), enable_gqa=True).transpose(1, 2)
    result["attn_err"].append(float((out.float() - ref).abs().max()))
    result["bool_err"].append(float((att.attention(q, k, v, allowed).float() - out.float()).abs().max()))
    # chunks of keys in programs of their own or one after another, with each row's limit or without: one result
    limit = (pos.amax(1) + 1).to(torch.int32)
    for split in ("0", "1"):
        os.environ["ADAFLASH_ATTN_SPLIT"] = split
        result.setdefault("split_same", []).append(torch.equal(att.attention(q, k, v, additive), out)
                                                   and torch.equal(att.attention(q, k, v, additive, limit), out))
    del os.environ["ADAFLASH_ATTN_SPLIT"]
    same = True
    for row in range(b):  # each query alone, over only the keys it may see: the same bits
        if interpreted:  # numpy's matmul rounds a row by its place in the tile: keep the tiles, cut keys and rows
            see = int(pos[row].max()) + 1
            alone = att.attention(q[row:row + 1], k[row:row + 1, :see], v[row:row + 1, :see],
                                  additive[row:row + 1, :, :see])
            same = same and torch.equal(alone, out[row:row + 1])
            continue
        for i in range(queries):
            see = int(pos[row, i]) + 1
            alone = att.attention(q[row:row + 1, i:i + 1], k[row:row + 1, :see], v[row:row + 1, :see],
                                  additive[row:row + 1, i:i + 1, :see])
            same = same and torch.equal(alone, out[row:row + 1, i:i + 1])
    result["attn_rows"].append(same)
    # key steps no query of a row may see are never read: NaN there changes nothing (0 x NaN would)
    unseen_k, unseen_v = k.clone(), v.clone()
    for row in range(b):
        first_unseen = -(-(int(pos[row].max()) + 1) // att.ATTN_KEYS) * att.ATTN_KEYS
        unseen_k[row, first_unseen:] = float("nan")
        unseen_v[row, first_unseen:] = float("nan")
    result.setdefault("unseen_skipped", []).append(torch.equal(att.attention(q, unseen_k, unseen_v, additive), out)
                                                   and torch.equal(att.attention(q, unseen_k, unseen_v, allowed),
                                                                   att.attention(q, k, v, allowed)))
print(json.dumps(result))
"""


def _check(device: str, dtype: str, env: dict[str, str] | None = None) -> dict:
    return run_json_script(CHECKS, device, dtype, env=env)


def _assert_invariant_and_close(result: dict, tolerance: float) -> None:
    assert all(result["mm_rows"]) and all(result["norm_rows"]) and all(result["attn_rows"]), result
    assert all(result["unseen_skipped"]) and all(result["split_same"]), result
    assert max(result["mm_err"]) < tolerance and max(result["norm_err"]) < 8 * tolerance, result
    assert max(result["attn_err"]) < tolerance and max(result["bool_err"]) < tolerance, result


@interpreted_loops
def test_invariant_kernels_under_the_interpreter():
    """fp16 on a CPU: GEMM rows (with and without bias, 2-D and 3-D input), norm rows and attention
    queries keep their bits across row counts and key ranges; values within fp16 rounding of float32
    math. Rows moved to another place in a tile (attention's query counts, a 3-D input's later rows)
    are left to the compiled test: numpy's float32 matmul, under tl.dot here, rounds a row by its
    place among the tile's rows (OpenBLAS in numpy 2.4)."""
    _assert_invariant_and_close(_check("cpu", "float16", {"TRITON_INTERPRET": "1"}), 0.01)


def test_a_forced_split_of_attention_keys_is_read_from_the_environment(monkeypatch):
    from adaflash.models import invariant_attention as invariant
    monkeypatch.setenv("ADAFLASH_ATTN_SPLIT", "1")
    assert invariant.split_keys(10**6, 2) and not invariant.split_keys(1, 1)  # one chunk has nothing to split
    monkeypatch.setenv("ADAFLASH_ATTN_SPLIT", "0")
    assert not invariant.split_keys(1, 8)
    monkeypatch.setenv("ADAFLASH_ATTN_SPLIT", "auto")
    assert invariant.split_keys(1, 8) and not invariant.split_keys(invariant.SPLIT_BELOW, 8)
    # a verify pass splits only where its programs would leave most of a card idle (batch 1 to a few)
    assert invariant.split_keys(8, 8, queries=9) and not invariant.split_keys(invariant.SPLIT_VERIFY_BELOW, 8, queries=9)
    monkeypatch.setenv("ADAFLASH_ATTN_SPLIT", "yes")
    with pytest.raises(ValueError, match="ADAFLASH_ATTN_SPLIT='yes'"):
        invariant.split_keys(1, 8)


def test_weights_that_need_gradients_never_take_the_kernels(monkeypatch):
    """The kernels have no backward: a drafter in training (weights requiring grad, inputs not) must
    run torch's ops. Checked with the device test lifted, so a CPU sees the gate's logic."""
    from adaflash.models import invariant, invariant_attention, kernels
    monkeypatch.setattr(invariant, "fusable", lambda t: not (torch.is_grad_enabled() and t.requires_grad))
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    weight = torch.nn.Parameter(torch.randn(8, 64, dtype=torch.bfloat16))
    assert not invariant.mm_available(x, weight) and not invariant.rms_norm_available(x, weight[0])
    with torch.no_grad():
        assert invariant.mm_available(x, weight) and invariant.rms_norm_available(x, weight[0])
        assert invariant_attention.attention_available(64, x) and not invariant_attention.attention_available(48, x)
        assert not invariant.mm_available(x.float(), weight) and not invariant.mm_available(x.half(), weight)
    assert kernels.fusable(x) is False  # the real gate: a CPU tensor


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_invariant_kernels_compiled(dtype):
    _assert_invariant_and_close(_check("cuda", dtype), 0.02 if dtype == "bfloat16" else 0.01)


GSM8K_LIKE = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
    "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
    "How much more money does Betty need to buy the wallet?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 small pizzas. "
    "A large pizza has 16 slices and a small pizza has 8 slices. If he eats it all, how many pieces does he eat that day?",
    "Tina makes $18.00 an hour. If she works more than 8 hours per shift, she is eligible for overtime, which is "
    "paid by your hourly wage + 1/2 your hourly wage. If she works 10 hours every day for 5 days, how much money does she make?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
    "Write a haiku about the sea.",
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_speculative_decoding_gives_vanilla_tokens_on_smollm2(smollm2_folder):
    """The goal the kernels exist for: in bf16 on a GPU, with CUDA graphs and the built-in drafter
    (drafts accepted and rejected), DFlash and AdaFlash at batch 4 emit Vanilla-at-batch-1's tokens."""
    from adaflash.engine.build import build_engine
    from adaflash.models.loading import load_target
    from tests.test_engine_lossless import make_requests

    target = load_target(str(smollm2_folder), device="cuda", dtype="bfloat16")

    def requests():
        return make_requests(target, prompts=GSM8K_LIKE, max_new_tokens=160, ignore_eos=True)

    reference = [o.output_ids for o in build_engine(target,
                                                    config=EngineConfig(max_batch=1, max_len=1024)).generate(requests())]
    for method, draft in (("dflash", "smollm2-135m-dflash"), ("adaflash", "smollm2-135m-dflash"),
                          ("adaflash", "smollm2-135m-general")):
        engine = build_engine(target, method, draft, config=EngineConfig(max_batch=4, max_len=1024))
        outputs = engine.generate(requests())
        assert [o.output_ids for o in outputs] == reference, (method, draft)
        assert sum(o.meta_info["spec_accept_length"] for o in outputs) / len(outputs) > 1.5


ENGINE_CHECK = r"""
import json, sys, torch
from adaflash.models import invariant, invariant_attention
from adaflash.models.loading import load_target
from tests.test_engine_lossless import make_requests, oracle_engine, vanilla

from adaflash.engine.passes import DevicePasses

on = [False]
invariant.fusable = lambda t: on[0] and not (torch.is_grad_enabled() and t.requires_grad)  # a CPU, interpreted
calls = {}
eager_head = []  # the output layer's rows once decoding starts: interpreted, each call of it takes 3 s
in_prefill = [False]
tiles = set()  # (inside the engine's prefill, attention tile rows) of the engine's attention calls
real_prefill = DevicePasses.prefill
def prefill(self, *args):
    in_prefill[0] = True
    try:
        return real_prefill(self, *args)
    finally:
        in_prefill[0] = False
DevicePasses.prefill = prefill
def launch(*args, _f=invariant_attention._launch):
    if eager_head and args[-1] != torch.float32:  # the engine's passes, not a tile's float32 probe
        tiles.add((in_prefill[0], args[5]))
    return _f(*args)
invariant_attention._launch = launch
for module, name in ((invariant, "mm"), (invariant, "rms_norm"), (invariant_attention, "attention")):
    def counted(*args, _f=getattr(module, name), _n=name):
        calls[_n] = calls.get(_n, 0) + 1
        if _n == "mm" and args[1].shape[0] in eager_head:
            calls["eager_head"] = calls.get("eager_head", 0) + 1
            return torch.nn.functional.linear(*args)
        return _f(*args)
    setattr(module, name, counted)
target = load_target(sys.argv[1], device="cpu", dtype="float16")
ids = torch.tensor([target.encode("Natalia sold clips to 48 of her friends in April.")])
def logits():
    return target.model(ids, torch.arange(ids.shape[1])[None], target.model.new_cache(1, 64), torch.tensor([0]))[0].float()
eager = logits()
on[0] = True
error = float((logits() - eager).abs().max() / eager.abs().max())
eager_head.append(target.model.cfg.vocab_size)
reference = vanilla(target, make_requests(target, n=2, max_new_tokens=6, ignore_eos=True))
engine = oracle_engine(target, make_requests(target, n=2), reference, "dflash")
outputs = engine.generate(make_requests(target, n=2, max_new_tokens=6, ignore_eos=True))
print(json.dumps({"same": [o.output_ids for o in outputs] == [o.output_ids for o in reference], "error": error,
                  "tau": [o.meta_info["spec_accept_length"] for o in outputs], "calls": calls,
                  "tiles": sorted(tiles), "verify_tile_agrees": list(invariant_attention._SAME_BITS.values())}))
"""


@interpreted_loops
def test_the_engine_runs_on_the_invariant_kernels_under_the_interpreter(tiny_llama):
    """The wiring a CPU cannot see otherwise: an fp16 target whose every GEMM, norm and attention goes
    through the kernels (the interpreter standing in for the GPU) gives torch's logits to fp16 rounding,
    and decodes Vanilla's tokens with drafts accepted, cache views, GQA and masks as the engine hands
    them over, its prefills on wider attention tiles than its decode and verify passes. While decoding, the 49,152-wide output layer runs torch's GEMM: the logits check above
    took it through the kernel, and interpreted it costs 3 s a call, two thirds of the test."""
    result = run_json_script(ENGINE_CHECK, str(tiny_llama), env={"TRITON_INTERPRET": "1"})
    assert result["same"] and result["error"] < 0.01, result
    assert min(result["tau"]) > 1.3, result
    layers = 4  # the tiny target's: every layer's projections, norms and attention, each pass
    assert result["calls"]["attention"] >= 2 * layers and result["calls"]["rms_norm"] >= 4 * layers, result
    assert result["calls"]["mm"] >= 4 * layers and result["calls"]["eager_head"] >= 2, result
    # prompts prefill with wide attention tiles, decode and verify passes (and the drafter) with narrow ones:
    # a verify's wider tile only where its probe gave the decode tile's bits
    from adaflash.models.invariant_attention import ATTN_ROWS, PREFILL_ROWS, VERIFY_ROWS
    outside = {rows for inside, rows in result["tiles"] if not inside}
    assert {rows for inside, rows in result["tiles"] if inside} == {PREFILL_ROWS}, result
    assert ATTN_ROWS in outside and outside <= {ATTN_ROWS, VERIFY_ROWS}, result
    assert (VERIFY_ROWS in outside) == any(result["verify_tile_agrees"]), result


TILES = r"""
import json, torch
from adaflash.models import invariant as inv
torch.manual_seed(0)
w = (torch.randn(1024, 1024) * 0.05).half()
x = torch.randn(300, 1024).half()
base = inv.base_tiles(1024, 1024)
sums = lambda rows, tile: inv._launch(rows, w, None, tile, torch.float32)
out = {"base": list(base), "chosen": [], "same_sums": [], "own_tile_same": []}
for m in (1, 4, 40, 300):
    tile = inv._tile_for(x[:m], w, None)
    out["chosen"].append(list(tile))
    out["same_sums"].append(torch.equal(sums(x[:m], tile), sums(x[:m], base)))
    out["own_tile_same"].append(torch.equal(sums(x[:m], inv.mm_tiles(m, 1024, 1024)), sums(x[:m], base)))
    out.setdefault("own_tile", []).append(list(inv.mm_tiles(m, 1024, 1024)))
# a tile of the base tile's shape with other warps and stages sums as it does (the interpreter ignores both)
inv.mm_tiles = lambda m, n, k: base[:3] + (8, 2)
out["same_shape_tile"] = list(inv._tile_for(x[:300], w, None))
print(json.dumps(out))
"""


@interpreted_loops
def test_a_gemm_tile_chosen_by_row_count_is_used_only_where_it_sums_as_the_base_tile():
    """Under the interpreter a deeper tile (BK 256, a decode step's few rows) adds in another order than
    the base tile (whether a wider one does depends on numpy's BLAS): `mm` checks a tile's float32 sums
    against the base tile's before it uses it, so every row count keeps the base tile's bits, and a tile
    that sums alike is used."""
    result = run_json_script(TILES, env={"TRITON_INTERPRET": "1"})
    assert result["own_tile_same"][:2] == [False, False], result  # the deep tile really sums otherwise here
    assert all(result["same_sums"]), result
    for chosen, own, same in zip(result["chosen"], result["own_tile"], result["own_tile_same"]):
        assert chosen == (own if same else result["base"]), result
    assert result["same_shape_tile"] == result["base"][:3] + [8, 2], result


@pytest.mark.parametrize("keys", [1, 16, 17, 303])
def test_attention_masks_reach_the_kernel_with_rows_at_multiples_of_16(keys):
    """Triton compiles a kernel variant per argument that divides by 16 (or is 1), and variants can sum
    in other orders: a mask whose row stride is the key count gave a query other bits at 303 keys (a
    DFlash verify) than at 288 (Vanilla's step) on an H100. `aligned_mask` keeps the strides at
    multiples of 16 and the values as they were."""
    from adaflash.models.invariant_attention import aligned_mask

    mask = torch.randn(2, 3, keys).to(torch.bfloat16)
    aligned = aligned_mask(mask)
    assert aligned.stride(0) % 16 == 0 and aligned.stride(1) % 16 == 0 and aligned.stride(2) == 1
    assert torch.equal(aligned, mask)
    assert aligned_mask(aligned).data_ptr() == aligned.data_ptr()  # already aligned: no copy


TILES_OF_ATTENTION = r"""
import json, torch
from adaflash.models import invariant_attention as inv
from adaflash.models.layers import additive_mask
from adaflash.models.target import causal_mask
torch.manual_seed(0)
b, n, heads, kv, d = 2, 40, 6, 2, 16
q, k, v = (torch.randn(b, n, h, d).half() for h in (heads, kv, kv))
positions = torch.arange(n).expand(b, n)
mask = additive_mask(causal_mask(positions, n), torch.float16)
limit = positions.amax(1).add(1).to(torch.int32)
exact = torch.softmax((q.float().transpose(1, 2) @ k.float().repeat_interleave(3, 2).permute(0, 2, 3, 1)) / d ** 0.5
                      + mask.float()[:, None], -1) @ v.float().repeat_interleave(3, 2).transpose(1, 2)
exact = exact.transpose(1, 2)
out = {}
for rows in (16, 32, 64):
    for major in (False, True):
        got = inv.attention(q, k, v, mask, limit, tile_rows=rows, tile_major=major)
        out[f"{rows}{'T' if major else ''}"] = float((got.float() - exact).abs().max())
with inv.prefill_tiles():
    out["inside"] = inv._TILE_ROWS.get()
out["verify"] = inv._pass_tile(q, k, v, mask, limit)  # 40 queries x 3 heads a kv head: the wider tile if it agrees
probe = [inv._launch(q[:1], k[:1], v[:1], mask[:1], limit[:1], rows, False, torch.float32) for rows in (32, 16)]
out["agrees"] = bool(torch.equal(*probe))
out["decode"] = inv._pass_tile(q[:, -1:], k, v, mask[:, -1:], limit)  # 3 pairs a kv head: one narrow tile
inv.invariant.TILES_FIXED = True
out["fixed"] = inv._pass_tile(q, k, v, mask, limit)
print(json.dumps(out))
"""


@interpreted_loops
def test_attention_takes_any_tile_of_query_pairs_and_either_grid_order():
    """A prefill's and a verify's wider tiles and a tile-major grid (a row's tiles launched side by side)
    compute the same attention as the decode tile, within fp16 rounding of float32 math; `prefill_tiles`
    sets the prefill tile inside it; a pass of many queries takes the verify tile exactly when its probe
    gives the decode tile's float32 bits, a decode step and ADAFLASH_MM_TILES=base the decode tile."""
    result = run_json_script(TILES_OF_ATTENTION, env={"TRITON_INTERPRET": "1"})
    assert all(result[key] < 2e-3 for key in ("16", "16T", "32", "32T", "64", "64T")), result
    from adaflash.models.invariant_attention import ATTN_ROWS, PREFILL_ROWS, VERIFY_ROWS
    assert result["inside"] == PREFILL_ROWS and PREFILL_ROWS > VERIFY_ROWS > ATTN_ROWS, result
    assert result["verify"] == (VERIFY_ROWS if result["agrees"] else ATTN_ROWS), result
    assert result["decode"] == result["fixed"] == ATTN_ROWS, result
