"""Our decoder against transformers: same logits, same greedy tokens."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.models.loading import load_target
from adaflash.models.target import load_target_model


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen3"])
def test_logits_match_transformers_batched_with_offsets(fixture, request):
    folder = request.getfixturevalue(fixture)
    ours = load_target_model(folder)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    torch.manual_seed(0)
    a = torch.randint(0, 1000, (1, 9))
    b = torch.randint(0, 1000, (1, 5))
    with torch.no_grad():
        ref_a = hf(a).logits[0]
        ref_b = hf(b).logits[0]
    cache = ours.new_cache(slots=3, max_len=32)
    rows = torch.tensor([2, 0])
    # prefill both rows together (b right-padded), then continue a in two chunks
    ids = torch.zeros(2, 6, dtype=torch.long)
    ids[0] = a[0, :6]
    ids[1, :5] = b[0]
    pos = torch.arange(6).expand(2, 6)
    logits, _ = ours(ids, pos, cache, rows)
    torch.testing.assert_close(logits[0], ref_a[:6], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(logits[1, :5], ref_b, atol=1e-3, rtol=1e-4)
    cache.lens[rows] = torch.tensor([6, 5])
    more, _ = ours(a[:, 6:], torch.arange(6, 9)[None], cache, rows[:1])
    torch.testing.assert_close(more[0], ref_a[6:], atol=1e-3, rtol=1e-4)


def test_captured_hidden_states_are_hf_hidden_states(tiny_llama):
    ours = load_target_model(tiny_llama)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()
    ids = torch.randint(0, 1000, (1, 7))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True).hidden_states
    cache = ours.new_cache(1, 16)
    _, feats = ours(ids, torch.arange(7)[None], cache, torch.tensor([0]), capture=[0, 2])
    torch.testing.assert_close(feats[0], ref[1], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(feats[1], ref[3], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))])
def test_greedy_equals_transformers_generate_on_smollm2(smollm2_folder, device):
    """Our engine (on a GPU: graphs, in-order reads, the rotary table) against transformers on a CPU, both
    float32: bf16 parts ways at near-ties, so the default dtype of a GPU is not compared."""
    target = load_target(str(smollm2_folder), device=device, dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    prompts = ["What is 2+3?", "Name three colors of the rainbow."]
    requests, expected = [], []
    for prompt in prompts:
        ids = target.encode(target.render(prompt))
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        requests.append(Request(ids, SamplingParams(max_new_tokens=24)))
    outputs = Engine(target, "vanilla", config=EngineConfig(max_batch=2, max_len=256)).generate(requests)
    assert [o.output_ids for o in outputs] == expected


def test_a_target_loaded_without_its_tokenizer_imports_transformers_only_when_it_is_used(tiny_llama, tiny_target):
    """A trainer of the pipeline or of serve --adapt sees token ids: its process starts without transformers;
    text (or an engine) loads the tokenizer then, eos ids with it."""
    import subprocess
    import sys

    code = ("import sys; from adaflash.models.loading import load_target\n"
            "t = load_target(sys.argv[1], device='cpu', with_tokenizer=False)\n"
            "print('transformers' in sys.modules, t.eos_ids)\n"
            "print(t.encode('Hello there'), 'transformers' in sys.modules, t.eos_ids)")
    done = subprocess.run([sys.executable, "-c", code, str(tiny_llama)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "False []", f"{tiny_target.encode('Hello there')} True {tiny_target.eos_ids}"], done.stdout
    assert tiny_target.eos_ids


def test_unsupported_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="gpt2.*not supported"):
        load_target_model(tmp_path)


def test_fused_projections_keep_the_state_dict_and_share_its_storage(tiny_llama):
    """Fusing q/k/v and gate/up changes no parameter name or value; loading weights into the fused
    model reaches the fused GEMMs (the parameters are views of them), so the outputs follow."""
    fused = load_target_model(tiny_llama)  # the loader fuses
    attn = fused.model.layers[0].self_attn
    assert attn.qkv is not None and fused.model.layers[0].mlp.gate_up is not None
    unfused_keys = {k for k in fused.state_dict()}
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= unfused_keys
    assert not any("qkv" in k or "gate_up" in k for k in unfused_keys)
    assert attn.k_proj.weight.data_ptr() == attn.qkv[0][attn.q_proj.out_features:].data_ptr()

    ids = torch.randint(0, 1000, (1, 7))
    pos = torch.arange(7)[None]
    before, _ = fused(ids, pos, fused.new_cache(1, 16), torch.tensor([0]))
    state = {k: v.clone() for k, v in fused.state_dict().items()}
    with torch.no_grad():
        state["model.layers.0.self_attn.v_proj.weight"].mul_(3.0)
        state["model.layers.1.mlp.up_proj.weight"].mul_(-1.0)
    fused.load_state_dict(state)
    after, _ = fused(ids, pos, fused.new_cache(1, 16), torch.tensor([0]))
    assert not torch.allclose(before, after)
    torch.testing.assert_close(attn.qkv[0][-attn.v_proj.out_features:], state["model.layers.0.self_attn.v_proj.weight"])


def test_fused_projections_give_the_unfused_logits(tiny_qwen3, tiny_llama):
    for folder in (tiny_llama, tiny_qwen3):
        fused = load_target_model(folder)
        plain = load_target_model(folder)
        for layer in plain.model.layers:  # back to three GEMMs (and two for the MLP)
            layer.self_attn.qkv = None
            layer.mlp.gate_up = None
        ids = torch.randint(0, 1000, (2, 9))
        pos = torch.arange(9).expand(2, 9)
        rows = torch.tensor([0, 1])
        a, _ = fused(ids, pos, fused.new_cache(2, 16), rows)
        b, _ = plain(ids, pos, plain.new_cache(2, 16), rows)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_grouped_query_attention_folded_into_kv_groups_gives_the_same_output(tiny_llama):
    """The folded layout (each kv head's query heads stacked along the query length) attends exactly as
    the grouped kernel does: a layout change, not another model."""
    from adaflash.models.layers import fold_mask
    from adaflash.models.target import causal_mask

    model = load_target_model(tiny_llama)
    attn = model.model.layers[0].self_attn
    groups = attn.num_heads // attn.num_kv
    assert groups > 1, "the fixture must use grouped-query attention"
    b, n, s = 3, 4, 11
    q = torch.randn(b, n, attn.num_heads, attn.head_dim)
    k, v = torch.randn(2, b, s, attn.num_kv, attn.head_dim)
    positions = torch.tensor([[3], [5], [7]]) + torch.arange(n)  # rows at their own offsets
    mask = torch.zeros(b, n, s).masked_fill_(~causal_mask(positions, s), float("-inf"))
    plain = attn.attend(q, k, v, mask)
    folded = attn.attend(q, k, v, fold_mask(mask, groups))
    torch.testing.assert_close(folded, plain, atol=1e-5, rtol=1e-5)


def test_folded_attention_is_taken_for_wide_verify_passes_on_a_gpu_only():
    from adaflash.models.layers import grouped_queries

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert grouped_queries(gpu, 32, 4, 3) and grouped_queries(gpu, 128, 2, 3)
    assert not grouped_queries(gpu, 8, 4, 3)  # too few query rows: the grouped kernel is faster
    assert not grouped_queries(gpu, 128, 1, 3) and not grouped_queries(gpu, 1, 200, 3)  # decode, prefill
    assert not grouped_queries(gpu, 32, 4, 1) and not grouped_queries(cpu, 32, 4, 3)


def test_rotary_table_gives_the_computed_values_within_its_bound():
    """A fixed table serves positions below the caller's bound with the computed cos/sin bit for bit;
    past its length (or without a bound) they are computed; growing it keeps the old one alive."""
    from adaflash.models.layers import DecoderConfig, Rotary

    rotary = Rotary(DecoderConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, vocab_size=32, rope_theta=10000.0))
    positions = torch.tensor([[0, 5, 9], [30, 31, 2]])
    computed = rotary(positions, torch.bfloat16, bound=32)
    rotary.fix_table(32, torch.bfloat16)
    looked_up = rotary(positions, torch.bfloat16, bound=32)
    assert torch.equal(looked_up.cos, computed.cos) and torch.equal(looked_up.sin, computed.sin)
    rotary.table[0][5] = 7.0  # mark one row: lookups must see it
    assert (rotary(positions, torch.bfloat16, bound=32).cos[0, 1] == 7).all()
    rotary.table[0][5] = computed.cos[0, 1]
    far = torch.tensor([[40]])
    assert torch.equal(rotary(far, torch.bfloat16, bound=41).cos, rotary(far, torch.bfloat16).cos)  # computed
    first = rotary.table
    rotary.fix_table(16, torch.bfloat16)
    assert rotary.table is first  # already covered: nothing reallocated
    rotary.fix_table(64, torch.bfloat16)
    assert rotary.table[0].shape[0] == 64 and any(t is first for t in rotary._retired)  # graphs may still read it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_over_fused_heads_rotates_q_and_k_and_passes_values_through(dtype):
    """Rope over a whole fused projection (`Rope.over`) gives, bit for bit, rope of the q/k heads with
    cos/sin broadcast per head (the textbook form) and the value heads unchanged."""
    from adaflash.models.layers import DecoderConfig, Rotary, apply_rope

    rotary = Rotary(DecoderConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, vocab_size=32))
    rope = rotary(torch.tensor([[0, 5, 9], [30, 31, 2]]), dtype)
    heads = torch.randn(2, 3, 8, 16).to(dtype)  # 4 q + 2 k heads rotate, 2 v heads do not
    out = apply_rope(heads, *rope.over(6, 8))
    x = heads[:, :, :6]
    half = x.shape[-1] // 2
    textbook = x * rope.cos[:, :, None] + torch.cat([x[..., half:], x[..., :half]], dim=-1) * rope.sin[:, :, None]
    assert torch.equal(out[:, :, :6], textbook)
    assert torch.equal(out[:, :, 6:], heads[:, :, 6:])
    assert rope.over(6, 8)[0] is rope.over(6, 8)[0]  # built once a pass, shared by its layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_cpu_products_give_f_linear_for_any_row_count_and_layout(dtype):
    """`linear` takes its own path for 1-16 rows on a CPU (W @ xᵀ in float32, 2-D F.linear otherwise);
    strided 3-D input (a drafter's block positions sliced out of its hidden states) included."""
    from adaflash.models.layers import linear

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 40, dtype=dtype), torch.randn(96, dtype=dtype)
    hidden = torch.randn(2, 9, 40, dtype=dtype)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
    with torch.no_grad():
        for x in (hidden[:1, :1], hidden[:1, 1:8], hidden[:, 2:6], hidden[0], hidden[:1, ::2], hidden[:, :0]):
            for b in (None, bias):
                got = linear(x, weight, b)
                assert got.shape == (*x.shape[:-1], 96) and got.dtype == dtype
                torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), **tolerance)
        if dtype != torch.float32:  # the 2-D path is F.linear itself: the same bits
            x = hidden[:1, 1:8]
            assert torch.equal(linear(x, weight), torch.nn.functional.linear(x.reshape(7, 40), weight).reshape(1, 7, 96))
