"""Attention on prefill and verify shapes: each tile size and grid order's time, and whether it gives the
default tile's bits (a prefill may take any tile, so long as every prefill takes the same)."""

from functools import partial

import torch
import triton

from adaflash.models import invariant_attention as invariant
from adaflash.models.layers import additive_mask
from adaflash.models.target import causal_mask

CASES = [  # name, query heads, kv heads, head size, rows, queries a row (keys: as many, or 512 after 300)
    ("smollm2 prefill", 9, 3, 64, 256, 256), ("smollm2 prefill", 9, 3, 64, 64, 256),
    ("smollm2 prefill", 9, 3, 64, 8, 256), ("qwen3-8b prefill", 32, 8, 128, 32, 512),
    ("smollm2 verify", 9, 3, 64, 256, 8),
]


def main() -> None:
    torch.manual_seed(0)
    for name, heads, kv, d, b, n in CASES:
        keys, start = (n, 0) if n > 16 else (512, 300)
        q = torch.randn(b, n, heads, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, keys, kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        positions = (start + torch.arange(n, device="cuda")).expand(b, n)
        mask = additive_mask(causal_mask(positions, keys), torch.bfloat16)
        limit = positions.amax(1).add(1).to(torch.int32)
        reference = invariant.attention(q, k, v, mask, limit, tile_rows=invariant.ATTN_ROWS)
        cells = []
        for rows in (16, 32, 64, 128):
            for major in (False, True):
                call = partial(invariant.attention, q, k, v, mask, limit, tile_rows=rows, tile_major=major)
                same = torch.equal(call(), reference)
                us = triton.testing.do_bench(call, rep=30) * 1e3
                cells.append(f"{rows}{' tile-major' if major else ''}: {us:.0f}{'' if same else ' (other bits)'}")
        print(f"{name}, {b} rows x {n} queries, {keys} keys (us): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
