"""The Triton kernels' logic on a CPU, through Triton's interpreter (TRITON_INTERPRET=1, numpy
underneath), so every CI machine checks them; the GPU tests in test_engine_graphs.py check them
compiled. The interpreter lacks libdevice (the SwiGLU kernel's exp) and rounds bf16 its own way, so
SwiGLU and bf16 are left to the GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.json_script import run_json_script

pytest.importorskip("triton")  # the dev extra installs it; torch's CPU wheels do not

CHECKS = r"""
import json, torch
from adaflash.engine.sampling import accept
from adaflash.models.kernels import accept_commit, rope_heads
from adaflash.models.layers import DecoderConfig, RMSNorm, Rotary, apply_rope

torch.manual_seed(0)
result = {"accept": 0, "accept_failures": [], "rope": [], "rope_values": [], "normed_rope_max": [], "store": []}
slots, max_len = 6, 40
for trial in range(80):
    b, w = int(torch.randint(1, 5, ())), int(torch.randint(1, 10, ()))
    block, post = torch.randint(0, 4, (b, w)), torch.randint(0, 4, (b, w))
    for r in range(b):
        m = int(torch.randint(0, w, ()))
        post[r, :m] = block[r, 1:1 + m]
    lens, rows = torch.randint(0, max_len - w - 1, (b,)), torch.randperm(slots)[:b]
    verify = torch.randint(0, w, (b,)) if trial % 2 else None
    tokens = torch.zeros(slots, max_len + 1, dtype=torch.long)
    lengths, draft_lengths = torch.zeros(slots, dtype=torch.long), torch.zeros(slots, dtype=torch.long)
    packed = accept_commit(block, post, lens, rows, verify, w - 1, tokens, lengths, draft_lengths)
    accepted, emitted = accept(block[:, 1:], post, verify)
    counts = verify if verify is not None else torch.full((b,), w - 1)
    expected = torch.zeros(slots, max_len + 1, dtype=torch.long)
    expected[rows[:, None], lens[:, None] + torch.arange(1, w + 1)] = emitted
    ok = (torch.equal(packed, torch.cat([accepted[:, None], counts[:, None], emitted], dim=1))
          and torch.equal(tokens, expected) and torch.equal(lengths[rows], lens + accepted + 1)
          and torch.equal(draft_lengths, lengths))
    result["accept"] += 1
    if not ok:
        result["accept_failures"].append(trial)

rotary = Rotary(DecoderConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=9,
                              num_key_value_heads=3, head_dim=64, vocab_size=32))
q_norm, k_norm = RMSNorm(64, 1e-5), RMSNorm(64, 1e-5)
with torch.no_grad():
    q_norm.weight.uniform_(0.5, 1.5)
    k_norm.weight.uniform_(0.5, 1.5)
q_norm, k_norm = q_norm.half(), k_norm.half()
for b, n in ((1, 1), (1, 4), (3, 2)):
    rope = rotary(torch.randint(0, 500, (b, n)), torch.float16)
    heads = (torch.randn(b, n, 15, 64) * 3).half()
    out = rope_heads(heads, rope.cos, rope.sin, 9, 12)
    result["rope"].append(torch.equal(out, apply_rope(heads, *rope.over(12, 15))))
    kv = heads[:, :, 9:].contiguous()
    result["rope"].append(torch.equal(rope_heads(kv, rope.cos, rope.sin, 0, 3), apply_rope(kv, *rope.over(3, 6))))
    with torch.no_grad():
        normed = torch.cat([q_norm(heads[:, :, :9]), k_norm(heads[:, :, 9:12]), heads[:, :, 12:]], dim=2)
        fused = rope_heads(heads, rope.cos, rope.sin, 9, 12, (q_norm.weight, k_norm.weight, 1e-5))
    result["normed_rope_max"].append(float((fused.float() - apply_rope(normed, *rope.over(12, 15)).float()).abs().max()))
    result["rope_values"].append(torch.equal(fused[:, :, 12:], heads[:, :, 12:]))
    # Storing k/v into a cache's flat layer at scattered rows: the rows hold eager rope's k and v, the
    # query heads come back, every other cache row stays untouched.
    keys, values = torch.full((50, 3, 64), 7.0).half(), torch.full((50, 3, 64), 7.0).half()
    where = torch.randperm(50)[:b * n]
    stored = rope_heads(heads, rope.cos, rope.sin, 9, 12, store=(keys, values, where))
    eager = apply_rope(heads, *rope.over(12, 15))
    k_expected, v_expected = torch.full_like(keys, 7.0), torch.full_like(values, 7.0)
    k_expected.index_copy_(0, where, eager[:, :, 9:12].reshape(-1, 3, 64))
    v_expected.index_copy_(0, where, eager[:, :, 12:].reshape(-1, 3, 64))
    result["store"].append(torch.equal(stored[:, :, :9], eager[:, :, :9]) and torch.equal(keys, k_expected)
                           and torch.equal(values, v_expected))
    # Keys and values alone (no query heads), as the DFlash drafter's context takes them.
    keys.fill_(7.0)
    values.fill_(7.0)
    rope_heads(kv, rope.cos, rope.sin, 0, 3, store=(keys, values, where))
    result["store"].append(torch.equal(keys, k_expected) and torch.equal(values, v_expected))
print(json.dumps(result))
"""


def test_triton_kernels_under_the_interpreter():
    """Acceptance kernel = `accept` plus the commit's writes (80 random cases: widths 1-9, with and
    without verify counts); rope kernel = eager rope in fp16 bit for bit, q/k layouts and k/v only;
    with q/k norms within fp16 rounding, values copied; storing k/v into cache rows writes exactly
    eager rope's k and v there and nothing elsewhere, with query heads or without."""
    result = run_json_script(CHECKS, env={"TRITON_INTERPRET": "1"}, timeout=600)
    assert result["accept"] == 80 and result["accept_failures"] == []
    assert result["rope"] == [True] * 6 and result["rope_values"] == [True] * 3
    assert max(result["normed_rope_max"]) < 0.02
    assert result["store"] == [True] * 6


def test_adaflash_triton_turns_the_kernels_off_and_refuses_a_bad_value():
    """ADAFLASH_TRITON=0 leaves every pass to the eager code; another value is refused with the
    variable's name (here with Triton installed, so only the variable decides)."""
    code = "import adaflash.models.kernels as k; print(k.ENABLED)"
    def run(value):
        return subprocess.run([sys.executable, "-c", code], env={**os.environ, "ADAFLASH_TRITON": value},
                              capture_output=True, text=True, timeout=300)
    assert run("1").stdout.strip() == "True"
    assert run("0").stdout.strip() == "False"
    refused = run("sometimes")
    assert refused.returncode != 0 and "ADAFLASH_TRITON='sometimes': expected 0 or 1" in refused.stderr
