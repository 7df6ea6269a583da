"""Every GEMM tile's time on a model's four projections by row count, and whether it gives the base tile's bits
(a tile that does not is never used: `invariant.mm`). Usage: mm_tiles.py smollm2|qwen3-8b ROWS,ROWS,..."""

import sys
from functools import partial

import torch
import triton

from adaflash.models import invariant

SHAPES = {  # (out, in) of the fused q/k/v, o, fused gate/up and down projections
    "smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
}
TILES = [(64, 32, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3), (128, 128, 64, 8, 3),
         (128, 128, 32, 4, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (64, 128, 128, 4, 3), (128, 64, 128, 8, 3),
         (16, 32, 256, 4, 3), (16, 32, 256, 4, 5), (16, 16, 512, 4, 4), (16, 64, 128, 4, 3), (32, 32, 256, 4, 3),
         (64, 32, 128, 4, 3)]


def sweep(model: str, rows: list[int]) -> None:
    torch.manual_seed(0)
    for n, k in SHAPES[model]:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            base = invariant.base_tiles(n, k)
            chosen = invariant.mm_tiles(m, n, k)
            reference = invariant._launch(x[:64], weight, None, base, torch.float32)
            timed = []
            for tile in dict.fromkeys([base, chosen, *TILES]):
                try:
                    same = torch.equal(invariant._launch(x[:64], weight, None, tile, torch.float32), reference)
                    us = triton.testing.do_bench(partial(invariant._launch, x, weight, None, tile), rep=25) * 1e3
                except triton.runtime.errors.OutOfResources:
                    continue
                timed.append((us, tile, same))
            cublas = triton.testing.do_bench(partial(torch.matmul, x, weight.T), rep=25) * 1e3
            best = min(t for t in timed if t[2])
            mark = {base: "base", chosen: "chosen"}
            print(f"{n}x{k} at {m} rows: cuBLAS {cublas:.1f} us, best {best[1]} {best[0]:.1f} us | "
                  + " ".join(f"{mark.get(tile, tile)}:{us:.1f}{'' if same else '(other bits)'}"
                             for us, tile, same in timed), flush=True)


if __name__ == "__main__":
    sweep(sys.argv[1], [int(m) for m in sys.argv[2].split(",")])
