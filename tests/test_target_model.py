"""Our decoder against transformers: same logits, same greedy tokens."""

import pytest
import torch
from transformers import AutoModelForCausalLM

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


def test_greedy_equals_transformers_generate_on_smollm2(smollm2_folder):
    target = load_target(str(smollm2_folder))
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    prompts = ["What is 2+3?", "Name three colors of the rainbow."]
    requests, expected = [], []
    for prompt in prompts:
        ids = target.encode(target.render(prompt))
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        requests.append(Request(ids, SamplingParams(max_new_tokens=24)))
    outputs = Engine(target, "vanilla", max_batch=2, max_len=256).generate(requests)
    assert [o.output_ids for o in outputs] == expected


def test_unsupported_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="gpt2.*not supported"):
        load_target_model(tmp_path)
