"""bf16 on a CPU is lossless: a position verified in a block gets the bits of Vanilla's one-token step.

A verify pass runs 9 queries over 8 more keys where Vanilla runs 1; on a CPU, SDPA and oneDNN's one-row
GEMM round by those counts, and in bf16 one flipped bit changed greedy tokens in 7 of 10 suite answers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adaflash.engine.config import EngineConfig
from adaflash.models.cpu_attention import cpu_row_invariant_attention
from tests.test_engine_lossless import make_requests, vanilla


def _attention_inputs(batch: int, keys: int, heads: int = 9, kv: int = 3, d: int = 64):
    torch.manual_seed(0)
    q = torch.randn(batch, 16, heads, d).to(torch.bfloat16)
    k = torch.randn(batch, keys, kv, d).to(torch.bfloat16)
    v = torch.randn(batch, keys, kv, d).to(torch.bfloat16)
    return q, k, v


def _causal(first: int, queries: int, keys: int, batch: int) -> torch.Tensor:
    positions = torch.arange(first, first + queries)
    return (torch.arange(keys)[None, :] <= positions[:, None]).expand(batch, queries, keys)


def test_row_invariant_attention_is_sdpa_and_keeps_each_querys_bits():
    q, k, v = _attention_inputs(batch=2, keys=1100)
    for first, queries in ((40, 9), (185, 9), (250, 16), (600, 9), (1080, 16)):  # across 192 and 256 keys too
        keys = first + queries
        mask = _causal(first, queries, keys, 2)
        out = cpu_row_invariant_attention(q[:, :queries], k[:, :keys], v[:, :keys], mask)
        reference = F.scaled_dot_product_attention(
            q[:, :queries].float().transpose(1, 2), k[:, :keys].float().transpose(1, 2),
            v[:, :keys].float().transpose(1, 2), attn_mask=mask[:, None], enable_gqa=True).transpose(1, 2)
        assert (out.float() - reference).abs().max() < 0.02
        additive = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill_(~mask, float("-inf"))
        assert torch.equal(cpu_row_invariant_attention(q[:, :queries], k[:, :keys], v[:, :keys], additive), out)
        for j in (0, 3, queries - 1):  # the query alone, over only the keys it may see: the same bits
            alone = cpu_row_invariant_attention(q[:, j:j + 1], k[:, :first + j + 1], v[:, :first + j + 1],
                                                _causal(first + j, 1, first + j + 1, 2))
            assert torch.equal(alone, out[:, j:j + 1]), (first, j)


@pytest.fixture(scope="module")
def smollm2_bf16(smollm2_folder):
    from adaflash.models.loading import load_target

    return load_target(str(smollm2_folder), device="cpu", dtype="bfloat16")


def test_a_verified_block_gives_each_position_the_bits_of_one_token_steps(smollm2_bf16):
    model = smollm2_bf16.model
    prompt = smollm2_bf16.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many.")

    def forward(cache, ids: list[int], start: int) -> torch.Tensor:
        logits, _ = model(torch.tensor([ids]), torch.arange(start, start + len(ids))[None], cache, torch.tensor([0]))
        cache.lens[0] = start + len(ids)
        return logits[0]

    with torch.no_grad():
        cache = model.new_cache(1, 256)
        steps = [forward(cache, prompt, 0)[-1]]
        tokens: list[int] = []
        for _ in range(17):
            tokens.append(int(steps[-1].argmax()))
            steps.append(forward(cache, [tokens[-1]], len(prompt) + len(tokens) - 1)[0])
        cache = model.new_cache(1, 256)
        forward(cache, prompt, 0)  # prompts prefill alike in every method; the answer goes in blocks of 9 and 8
        for start, end in ((0, 9), (9, 17)):
            block = forward(cache, tokens[start:end], len(prompt) + start)
            for j in range(end - start):
                assert torch.equal(block[j], steps[start + j + 1]), (start, j)


def test_speculative_decoding_in_bf16_on_a_cpu_gives_vanillas_tokens(smollm2_bf16):
    from adaflash.engine.build import build_engine

    prompts = ["Write a Python function is_palindrome(s) that ignores case and spaces.",
               "Give me three tips for a job interview."]
    requests = make_requests(smollm2_bf16, 2, prompts=prompts, max_new_tokens=48, ignore_eos=True)
    reference = [o.output_ids for o in vanilla(smollm2_bf16, requests)]
    for method in ("dflash", "adaflash"):
        engine = build_engine(smollm2_bf16, method, "smollm2-135m-general", config=EngineConfig(max_batch=2, max_len=256))
        requests = make_requests(smollm2_bf16, 2, prompts=prompts, max_new_tokens=48, ignore_eos=True)
        assert [o.output_ids for o in engine.generate(requests)] == reference, method


def test_bf16_if_native_takes_bf16_only_where_the_cpu_has_a_bf16_unit(monkeypatch):
    """The main job measures in `bf16-if-native`: bf16 on a CPU whose flags name a bf16 unit, float32 on
    one that would emulate it (much slower), bf16 on a GPU; `auto` stays float32 on a CPU."""
    from adaflash.models import loading

    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"
    older = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nmodel name\t: bf16 in a name is no flag\n"
    assert loading.cpu_has_native_bf16(x86) and loading.cpu_has_native_bf16(arm)
    assert not loading.cpu_has_native_bf16(older) and not loading.cpu_has_native_bf16("")
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda cpuinfo=None, n=native: n)
        assert loading.pick_dtype("cpu", "bf16-if-native") == expected
        assert loading.pick_dtype("cuda:0", "bf16-if-native") == torch.bfloat16
        assert loading.pick_dtype("cpu", "auto") == torch.float32
    with pytest.raises(ValueError, match="'bf17': expected .*bf16-if-native"):
        loading.pick_dtype("cpu", "bf17")


def test_the_commands_that_decode_default_to_bf16_where_the_cpu_has_a_bf16_unit(tiny_llama, monkeypatch):
    """generate, serve, eval, bench engine and data regenerate decode in bf16-if-native unless told: the dtype
    in which speculative decoding pays on a CPU. Seen through the dtype the target is loaded in."""
    import click
    from click.testing import CliRunner

    from adaflash.cli.main import cli
    from adaflash.models import loading

    def option(path: list[str]) -> click.Option:
        command, ctx = cli, click.Context(cli)
        for name in path:
            command = command.get_command(ctx, name)
        return next(p for p in command.params if p.name == "dtype")

    for path in (["generate"], ["serve"], ["eval"], ["bench", "engine"], ["data", "regenerate"]):
        assert option(path).default == "bf16-if-native", path
    from adaflash.pipeline.inference import InferenceConfig  # the pipeline's inference worker alike

    assert InferenceConfig("t", "d", "p.jsonl", "swap", "run", "ws").dtype == "bf16-if-native"
    seen = []
    real = loading.load_target_model
    monkeypatch.setattr(loading, "load_target_model", lambda folder, **kw: seen.append(kw["dtype"]) or real(folder, **kw))
    monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_llama), "--prompt", "Hi", "--max-new-tokens", "2",
                                      "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert seen == [torch.bfloat16]
