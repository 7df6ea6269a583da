"""The largest shapes the engine admits, on a GPU: offsets past 2**31 and the widest admission.

A 256-row prefill of long prompts once overflowed 32-bit offsets inside a Triton kernel ("an illegal
memory access"). These run only where CUDA is (the H200 runs them); on a CPU they are skipped.
"""

from __future__ import annotations

import pytest
import torch

from adaflash.engine.config import EngineConfig

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_cuda
def test_silu_mul_rows_past_32_bit_offsets_match_eager():
    from adaflash.models.kernels import silu_mul, silu_mul_eager

    width = 1536
    rows = 2**31 // (2 * width) + 4096  # the last rows start past 2**31 elements
    gate_up = torch.randn(rows, 2 * width, device="cuda", dtype=torch.bfloat16)
    fused = silu_mul(gate_up)
    tail = slice(rows - 8192, rows)
    assert torch.equal(fused[tail], silu_mul_eager(gate_up[tail]))
    del gate_up, fused
    torch.cuda.empty_cache()


@needs_cuda
def test_a_full_batch_of_long_prompts_decodes_as_a_small_batch_does(smollm2_folder):
    """256 slots, every one admitted at once with a 3,000-token prompt: the same greedy tokens as four
    of them alone (the engine is batch-invariant), and no kernel faults."""
    from adaflash.engine.engine import Engine
    from adaflash.engine.params import Request, SamplingParams
    from adaflash.models.loading import load_target

    target = load_target(str(smollm2_folder), device="cuda", dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (3000,), generator=gen).tolist() for _ in range(256)]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    wide = Engine(target, "vanilla", config=EngineConfig(max_batch=256, max_len=3100))
    outputs = wide.generate([Request(p, params, rid=str(i)) for i, p in enumerate(prompts)])
    small = Engine(target, "vanilla", config=EngineConfig(max_batch=4, max_len=3100))
    reference = small.generate([Request(p, params, rid=str(i)) for i, p in enumerate(prompts[:4])])
    assert [o.output_ids for o in outputs[:4]] == [o.output_ids for o in reference]
    assert all(len(o.output_ids) == 6 for o in outputs)
    assert wide.step_counts["prefill"] >= 256 * 3000 // 65536  # admitted in budget-sized prefills
