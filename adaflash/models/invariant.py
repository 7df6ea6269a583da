"""Batch-invariant GPU kernels (Triton): GEMM and RMSNorm whose every row's result is the same bits
however many rows run beside it; attention's, on the same rules, are in `invariant_attention`.

Why: speculative decoding is lossless only if the target's verify pass (k+1 tokens a row, rows of
a batch together) computes each token's logits exactly as Vanilla's one-token pass does. In bf16,
torch's kernels do not: cuBLAS picks a GEMM algorithm (tile, split-K) by the number of rows, the
reductions of RMSNorm and attention change their split with the shape, and near-ties in the argmax
then go the other way. Here each output element is reduced in one fixed order whatever the number of
rows, queries or keys: the GEMM's sum over k runs in the tensor cores' order from 0 up whatever its
tile (so the tile may follow the row count for speed, `mm_tiles`; `mm` checks that a tile gives the
base tile's bits before it uses it), the norm's by the row's width, attention's by the head size and
in fixed chunks of keys (`invariant_attention`).

Triton compiles a variant of a kernel for each pattern of its integer arguments (and pointers) that
are 1 or divide by 16, and variants may reduce in different orders (the layout a sum runs in follows
how the loads beside it were vectorized). An argument that varies with the pass's shape therefore
either is never specialized (`do_not_specialize`: rows, queries, keys) or is kept a multiple of 16
(attention's mask rows, `invariant_attention.aligned_mask`).

Every launch turns off the compiler's contraction of a multiply and an add into one FMA
(`enable_fp_fusion=False`): whether it contracts can differ between the variants Triton compiles for
different argument values, and an FMA rounds once where the two operations round twice.

bf16/fp16 on CUDA outside autograd with Triton on (`kernels.fusable`); float32, CPUs and training
run torch's ops (the float32 paths were already exact, per the lossless tests).
"""

from __future__ import annotations

import os

import torch

from adaflash.models.kernels import fusable, triton

if triton is not None:
    import triton.language as tl


def half_on_gpu(*tensors: torch.Tensor | None) -> bool:
    """All bf16 or all fp16, on the GPU, none needing a gradient (the kernels have no backward: a
    drafter's weights in training must not pass through them, whatever their inputs)."""
    given = [t for t in tensors if t is not None]
    return given[0].dtype in (torch.bfloat16, torch.float16) \
        and all(t.dtype == given[0].dtype and fusable(t) for t in given)


def mm_available(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    return half_on_gpu(x, weight, bias)


MmConfig = tuple[int, int, int, int, int]  # rows, columns and depth of a tile; warps; pipeline stages


def base_tiles(n: int, k: int) -> MmConfig:
    """The tile every row count may fall back to, from the weight's shape alone: narrow outputs get
    narrow tiles so enough programs stream the weight; deep inputs take longer steps."""
    return 64, (32 if n <= 1024 else 64), (128 if k >= 1024 else 64), 4, 3


def mm_tiles(m: int, n: int, k: int) -> MmConfig:
    """The tile for `m` rows: the fastest measured for each range of rows (an H200, each tile timed on
    each of the model's four projections), where the base tile leaves SMs idle (a decode step's few
    rows) or re-reads the weight (thousands of rows). Any tile gives each element the same bits (the sum
    over k runs in the tensor cores' order, 16 at a time from 0 up, whatever the tile), which `mm`
    checks once per shape.

    Qwen3-8B's projections at one row: 138 µs a layer with 5 stages against 152 with 3; at 32 rows
    154 against 174 with the 64-row tile. SmolLM2's at 4,096-65,536 rows (a prefill, a verify of 8
    at batch 512): 1.3-1.8x faster with 128 x 128 tiles; below that the base tile is as fast."""
    if k < 1024 or n < 1024:  # narrow models (SmolLM2): launch-bound at a decode step's rows
        return (128, 128, 64, 8, 3) if m >= 4096 else base_tiles(n, k)
    if m <= 16:
        return 16, 32, 256, 4, 5
    if m <= 32:
        return 32, 32, 256, 4, 3
    if m <= 64:
        return 64, 32, 128, 4, 3
    if triton.cdiv(n, 128) * triton.cdiv(m, 128) >= 96:
        return 128, 128, 64, 8, 3
    return 64, 128, 128, 4, 3


_SAME_BITS: dict[tuple, bool] = {}  # (device, dtype, n, k, tile) -> whether it agrees with the base tile


def _tile_for(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> MmConfig:
    """`mm_tiles`' choice once it has given the base tile's bits on these rows (checked once per shape
    and tile, outside graph capture; a tile that differs is never used), else the base tile."""
    m, k = rows.shape
    n = weight.shape[0]
    base = base_tiles(n, k)
    if TILES_FIXED:
        return base
    tile = mm_tiles(m, n, k)
    if tile == base:
        return base
    key = (rows.device, rows.dtype, n, k, tile)
    if key not in _SAME_BITS:
        if rows.is_cuda and torch.cuda.is_current_stream_capturing():
            return base
        # the float32 sums themselves: rounded to bf16, most differences in their order would not show
        probe = rows[:8]
        try:
            _SAME_BITS[key] = torch.equal(_launch(probe, weight, bias, tile, torch.float32),
                                          _launch(probe, weight, bias, base, torch.float32))
        except triton.runtime.errors.OutOfResources:  # a deep tile's stages past this card's shared memory
            _SAME_BITS[key] = False
    return tile if _SAME_BITS[key] else base


def _tiles_fixed() -> bool:
    """ADAFLASH_MM_TILES=base runs every GEMM with its base tile, and a verify's attention with a decode
    step's: to compare speed, or around a GPU whose tiles would round otherwise (`mm` and attention
    already fall back there)."""
    value = os.environ.get("ADAFLASH_MM_TILES", "auto").strip().lower()
    if value not in ("auto", "base"):
        raise ValueError(f"ADAFLASH_MM_TILES={value!r}: expected auto or base")
    return value == "base"


TILES_FIXED = _tiles_fixed()


def mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]ᵀ (+ bias) with float32 accumulation; check `mm_available` first."""
    rows = x.reshape(-1, x.shape[-1])
    if not rows.shape[0]:
        return x.new_empty(*x.shape[:-1], weight.shape[0])
    out = _launch(rows, weight, bias, _tile_for(rows, weight, bias))
    return out.view(*x.shape[:-1], weight.shape[0])


def _launch(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: MmConfig,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    (m, k), n = rows.shape, weight.shape[0]
    block_m, block_n, block_k, warps, stages = tile
    out = torch.empty(m, n, device=rows.device, dtype=dtype or rows.dtype)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _mm_kernel[grid](rows, weight, bias if bias is not None else weight, out, m, n, k,
                     rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1),
                     HAS_BIAS=bias is not None, BM=block_m, BN=block_n, BK=block_k, num_warps=warps,
                     num_stages=stages, enable_fp_fusion=False)
    return out


def rms_norm_available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return half_on_gpu(x, weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x·rsqrt(mean(x²) + eps)·weight over the last dimension, one program a row (float32 inside)."""
    width = x.shape[-1]
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, device=x.device, dtype=x.dtype)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, width, rows.stride(0), float(eps),
                                           BLOCK=triton.next_power_of_2(width), num_warps=4,
                                           enable_fp_fusion=False)
    return out.view(x.shape)


if triton is not None:

    @triton.jit(do_not_specialize=["m"])
    def _mm_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, m, n, k, sxm, sxk, swn, swk,
                   HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """One [BM, BN] output tile, accumulated over k in BK steps from 0 up: a fixed order per element."""
        rows = tl.program_id(1) * BM + tl.arange(0, BM)
        cols = tl.program_id(0) * BN + tl.arange(0, BN)
        depth = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for start in range(0, k, BK):
            kk = start + depth
            a = tl.load(x_ptr + rows[:, None] * sxm + kk[None, :] * sxk,
                        mask=(rows[:, None] < m) & (kk[None, :] < k), other=0.0)
            w = tl.load(w_ptr + cols[None, :] * swn + kk[:, None] * swk,
                        mask=(cols[None, :] < n) & (kk[:, None] < k), other=0.0)
            acc = tl.dot(a, w, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < n, other=0.0).to(tl.float32)[None, :]
        keep = (rows[:, None] < m) & (cols[None, :] < n)
        tl.store(out_ptr + rows[:, None] * n + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, width, row_stride, eps, BLOCK: tl.constexpr):
        """As transformers' Llama norm: normalize in float32, round, then scale by the weight."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        keep = cols < width
        x = tl.load(x_ptr + row * row_stride + cols, mask=keep, other=0.0)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / width + eps)
        w = tl.load(w_ptr + cols, mask=keep, other=0.0)
        y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
        tl.store(out_ptr + row * width + cols, y.to(x.dtype), mask=keep)
