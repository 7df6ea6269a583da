"""Batch-invariant GPU kernels (Triton): GEMM, RMSNorm and attention whose every row's result is
the same bits however many rows run beside it.

Why: speculative decoding is lossless only if the target's verify pass (k+1 tokens a row, rows of
a batch together) computes each token's logits exactly as Vanilla's one-token pass does. In bf16,
torch's kernels do not: cuBLAS picks a GEMM algorithm (tile, split-K) by the number of rows, the
reductions of RMSNorm and attention change their split with the shape, and near-ties in the argmax
then go the other way (on the H200 most of 128 GSM8K answers parted somewhere in 256 tokens).
Here the tiling depends only on the weight's shape (GEMM), the row's width (norm) and the head size
(attention), never on the number of rows, queries or keys: each output element is reduced in one
fixed order. Keys past a query's position are masked to exp(-inf) = 0, so a longer key range (a
larger context bucket) adds exact zeros.

Every launch turns off the compiler's contraction of a multiply and an add into one FMA
(`enable_fp_fusion=False`): whether it contracts can differ between the variants Triton compiles for
different argument values, and an FMA rounds once where the two operations round twice.

bf16/fp16 on CUDA outside autograd with Triton on (`kernels.fusable`); float32, CPUs and training
run torch's ops (the float32 paths were already exact, per the lossless tests).
"""

from __future__ import annotations

import math

import torch

from adaflash.models.kernels import fusable, triton

if triton is not None:
    import triton.language as tl

MM_ROWS = 64  # GEMM tile rows, for every row count: the per-row result must not depend on it
ATTN_ROWS = 16  # attention tile rows (query × head-of-group pairs)
ATTN_KEYS = 64  # keys per step of attention's online softmax: fixed, so each query's sums run in one order


def _half(*tensors: torch.Tensor | None) -> bool:
    """All bf16 or all fp16, on the GPU, none needing a gradient (the kernels have no backward: a
    drafter's weights in training must not pass through them, whatever their inputs)."""
    given = [t for t in tensors if t is not None]
    return given[0].dtype in (torch.bfloat16, torch.float16) \
        and all(t.dtype == given[0].dtype and fusable(t) for t in given)


def mm_available(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    return _half(x, weight, bias)


def mm_tiles(n: int, k: int) -> tuple[int, int]:
    """(columns, depth) of a GEMM tile, from the weight's shape alone: narrow outputs get narrow tiles
    so enough programs stream the weight; deep inputs take longer steps."""
    return (32 if n <= 1024 else 64), (128 if k >= 1024 else 64)


def mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]ᵀ (+ bias) with float32 accumulation; check `mm_available` first."""
    k = x.shape[-1]
    n = weight.shape[0]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m:
        block_n, block_k = mm_tiles(n, k)
        grid = (triton.cdiv(n, block_n), triton.cdiv(m, MM_ROWS))
        _mm_kernel[grid](rows, weight, bias if bias is not None else weight, out, m, n, k,
                         rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1),
                         HAS_BIAS=bias is not None, BM=MM_ROWS, BN=block_n, BK=block_k, num_warps=4, num_stages=3,
                         enable_fp_fusion=False)
    return out.view(*x.shape[:-1], n)


def rms_norm_available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _half(x, weight)


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


def attention_available(head_dim: int, *tensors: torch.Tensor) -> bool:
    """Whether attention over `tensors` (q, k, v; or any of a pass's activations) runs here: a
    power-of-two head size, for the tile."""
    return _half(*tensors) and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√d + mask)·v for q [b, n, heads, d], k and v [b, s, kv, d] (heads a multiple of kv),
    mask [b, n, s]: bool (True = may attend) or additive. Returns [b, n, heads, d]; a query that may
    attend to nothing gets zeros. Check `attention_available` first."""
    b, n, heads, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    groups = heads // kv
    mask = mask.expand(b, n, s)
    out = torch.empty(b, n, heads, d, device=q.device, dtype=q.dtype)
    grid = (b, kv, triton.cdiv(n * groups, ATTN_ROWS))
    _attention_kernel[grid](
        q, k, v, mask, out, n, s, 1.0 / math.sqrt(d),
        *q.stride(), *k.stride(), *v.stride(), *mask.stride(), *out.stride(),
        GROUPS=groups, D=d, BM=ATTN_ROWS, BN=ATTN_KEYS, BOOL_MASK=mask.dtype == torch.bool, num_warps=4, enable_fp_fusion=False)
    return out


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

    @triton.jit(do_not_specialize=["n", "s"])
    def _attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, n, s, scale,
                          sqb, sqn, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd,
                          smb, smn, sms, sob, son, soh, sod,
                          GROUPS: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BOOL_MASK: tl.constexpr):
        """One kv head of one row, BM (query, head of the group) pairs; keys in BN steps from 0 up with
        an online softmax, so each query's sums run in one order whatever the key range's length."""
        b = tl.program_id(0)
        kv = tl.program_id(1)
        pair = tl.program_id(2) * BM + tl.arange(0, BM)
        query = pair // GROUPS
        head = kv * GROUPS + pair % GROUPS
        live = query < n
        dims = tl.arange(0, D)
        q = tl.load(q_ptr + b * sqb + query[:, None] * sqn + head[:, None] * sqh + dims[None, :] * sqd,
                    mask=live[:, None], other=0.0)
        top = tl.full((BM,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, D), dtype=tl.float32)
        for start in range(0, s, BN):
            keys = start + tl.arange(0, BN)
            inside = keys < s
            kt = tl.load(k_ptr + b * skb + keys[None, :] * sks + kv * skh + dims[:, None] * skd,
                         mask=inside[None, :], other=0.0)
            scores = tl.dot(q, kt) * scale
            bias = tl.load(mask_ptr + b * smb + query[:, None] * smn + keys[None, :] * sms,
                           mask=live[:, None] & inside[None, :], other=0)
            if BOOL_MASK:
                scores = tl.where(bias != 0, scores, float("-inf"))
            else:
                scores += bias.to(tl.float32)
            scores = tl.where(inside[None, :], scores, float("-inf"))
            new_top = tl.maximum(top, tl.max(scores, axis=1))
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)
            p = tl.exp(scores - shift[:, None])
            alpha = tl.exp(top - shift)
            total = total * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_ptr + b * svb + keys[:, None] * svs + kv * svh + dims[None, :] * svd,
                         mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            top = new_top
        result = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out_ptr + b * sob + query[:, None] * son + head[:, None] * soh + dims[None, :] * sod,
                 result.to(out_ptr.dtype.element_ty), mask=live[:, None])
