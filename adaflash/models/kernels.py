"""Fused GPU kernels (Triton) for steps that eager torch splits into several small, strided kernels.

Each runs only on a CUDA tensor outside autograd, with Triton importable and not turned off
(`ADAFLASH_TRITON=0`); everywhere else (CPU, training) the caller's eager code runs. `silu_mul` gives the eager bits in every dtype; `rope_heads`
(bf16 and fp16 only) agrees with eager rope to rounding: its q/k values may differ from torch's
separate kernels by a couple of units in bf16's last place. Vanilla and the speculative methods
run the same kernels, so their comparison is unchanged; float32 runs eager and stays exact.
`accept_commit` is integer bookkeeping, exact by construction, in every dtype. The batch-invariant
GEMM and RMSNorm are in `invariant.py`, attention in `invariant_attention.py`.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:  # Triton ships with CUDA builds of torch on Linux; CPU-only installs do without it
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def _wanted() -> bool:
    """ADAFLASH_TRITON=0 runs the eager code everywhere: to compare with it, or around a kernel problem."""
    value = os.environ.get("ADAFLASH_TRITON", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise ValueError(f"ADAFLASH_TRITON={value!r}: expected 0 or 1")
    return value in ("1", "true", "on")


ENABLED = triton is not None and _wanted()


def kernels_on(device: torch.device | str) -> str:
    """What runs the fused steps on `device`, as benchmarks record it: "triton <version>", or "eager"
    (a CPU, no Triton, or ADAFLASH_TRITON=0). In bf16 the two round differently."""
    return f"triton {triton.__version__}" if ENABLED and str(device).startswith("cuda") else "eager"


def silu_mul_eager(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up of a fused [..., 2I] gate/up projection: the textbook two kernels."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def fusable(x: torch.Tensor) -> bool:
    """A CUDA tensor outside autograd (the kernels have no backward), the kernels on."""
    return ENABLED and x.is_cuda and not (torch.is_grad_enabled() and x.requires_grad)


def fused_silu_mul_available(x: torch.Tensor) -> bool:
    return fusable(x)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_mul_eager`, as one kernel on a GPU.

    Why: at 4 tokens (a verify) the gate and up halves are strided slices, and silu then mul each take
    torch's slow indexed path, markedly slower than the same two kernels on dense halves. One kernel
    reads both halves and writes the product once.
    """
    if not fused_silu_mul_available(gate_up):
        return silu_mul_eager(gate_up)
    width = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], width, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], width)


def fused_rope_available(heads: torch.Tensor) -> bool:
    """bf16/fp16 only: in float32 the compiler may contract rope's multiply-add into one FMA, which
    rounds once where torch rounds twice; a power-of-two head size, as the kernel's tile needs."""
    d = heads.shape[-1]
    return fusable(heads) and heads.dtype in (torch.bfloat16, torch.float16) \
        and d & (d - 1) == 0 and heads.is_contiguous()


def rope_heads(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, queries: int, roped: int,
               norms: tuple[torch.Tensor, torch.Tensor, float] | None = None,
               store: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rope over a fused projection's heads [b, n, total, d] in one kernel: heads below `roped`
    rotate (x·cos + roll(x)·sin, cos and signed sin [b, n, d]), the rest (values) are copied.
    `norms` (q weight, k weight, eps): RMS-normalize the rotating heads first, queries (heads below
    `queries`) with the one weight and keys with the other, as Qwen3's q/k norms do.

    `store` (keys [N, kv, d], values [N, kv, d], where [b·n]): write token t's roped keys and values
    at row where[t] of a KV cache's flat layer (`KVCache.flat_layer`) instead of into the result,
    whose key and value heads are then left unwritten.

    Why: eager rope is four kernels a layer (roll, two multiplies, an add), and with q/k norms five
    more (two copies of strided slices, two norms, a gather); one kernel reads the heads once.
    Storing into the cache saves the two index_copy kernels a layer that wrote keys and values there,
    a noticeable share of a decode step at large batch. Check with `fused_rope_available` first.
    """
    b, n, total, d = heads.shape
    tokens = b * n
    out = torch.empty_like(heads)
    cos = cos.reshape(tokens, d).contiguous()
    sin = sin.reshape(tokens, d).contiguous()
    q_weight, k_weight, eps = norms if norms is not None else (cos, cos, 0.0)  # weights unread without norms
    keys, values, where = store if store is not None else (out, out, cos)  # unread without a store
    if store is not None and not (keys.is_contiguous() and values.is_contiguous() and where.numel() == tokens):
        raise ValueError("rope_heads: store wants contiguous keys and values and one flat index per token")
    _rope_kernel[(tokens,)](heads, cos, sin, q_weight, k_weight, out, keys, values, where, queries, roped, total,
                            float(eps), D=d, HEADS=triton.next_power_of_2(total), NORM=norms is not None,
                            STORE=store is not None, num_warps=4)
    return out


def fused_accept_available(block: torch.Tensor) -> bool:
    return ENABLED and block.is_cuda


def accept_commit(block: torch.Tensor, posterior: torch.Tensor, lens: torch.Tensor, rows: torch.Tensor,
                  verify_n: torch.Tensor | None, verified: int, tokens: torch.Tensor, cache_lens: torch.Tensor,
                  draft_lens: torch.Tensor | None = None) -> torch.Tensor:
    """A greedy verify's acceptance and its bookkeeping in one kernel: what `engine.sampling.accept`
    and the token and length writes of `DevicePasses._commit` do in about twenty small ones.

    block [b, w]: the pending token and the drafts; posterior [b, w]: the target's argmax tokens;
    verify_n [b] drafts verified per row, or None: `verified` for every row. Writes each row's emitted
    tokens after its length into `tokens` (its slot's row, clamped to the last column) and the new
    length into `cache_lens` (and `draft_lens`). Returns [b, 2 + w]: accepted drafts, verified drafts,
    then the drafts with the bonus token at column `accepted` and at the end, as `accept` emits them.
    Check with `fused_accept_available` first.
    """
    b, w = block.shape
    out = torch.empty(b, 2 + w, dtype=torch.long, device=block.device)
    _accept_commit_kernel[(b,)](
        block, posterior, lens, rows, verify_n if verify_n is not None else lens, tokens, cache_lens,
        draft_lens if draft_lens is not None else cache_lens, out, w, verified, tokens.shape[1] - 1,
        block.stride(0), posterior.stride(0), tokens.stride(0),
        W=triton.next_power_of_2(w), HAS_VERIFY=verify_n is not None, HAS_DRAFT=draft_lens is not None, num_warps=1)
    return out


if triton is not None:

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, width, row_stride, BLOCK: tl.constexpr):
        """One row's block of columns: silu in float32 as torch computes it, x / (1 + exp(-x)) with
        an IEEE division and libdevice's exp, rounded to the input dtype; then the product with up in
        float32, rounded once more (torch's two kernels round at the same two places)."""
        row = tl.program_id(0).to(tl.int64)  # row * row_stride passes 2**31 in a wide prefill
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < width
        base = x_ptr + row * row_stride
        gate = tl.load(base + cols, mask=keep, other=0.0)
        up = tl.load(base + width + cols, mask=keep, other=0.0)
        g = gate.to(tl.float32)
        silu = tl.math.div_rn(g, 1.0 + libdevice.exp(-g)).to(gate.dtype)
        product = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
        tl.store(out_ptr + row * width + cols, product, mask=keep)

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, out_ptr, k_ptr, v_ptr, where_ptr, queries, roped,
                     total, eps, D: tl.constexpr, HEADS: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr):
        """One token's heads [total, D] as one tile; products and sums in float32, rounded to the input
        dtype as torch's kernels round (x·cos, roll(x)·sin, their sum), though the compiled kernel was
        seen to differ from them by up to 2 units in bf16's last place. With STORE, key and value heads
        go to the cache rows where[token] and only the query heads to out."""
        token = tl.program_id(0).to(tl.int64)  # offsets in int64: token * total * D can pass 2**31
        head = tl.arange(0, HEADS)[:, None]
        col = tl.arange(0, D)[None, :]
        turned = (col + D // 2) % D  # roll(x, D/2)[col]
        keep = head < total
        base = x_ptr + token * total * D + head * D
        x = tl.load(base + col, mask=keep, other=0.0)
        xr = tl.load(base + turned, mask=keep, other=0.0)
        rotate = head < roped
        if NORM:
            xf = x.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
            is_q = head < queries
            w = tl.where(is_q, tl.load(qw_ptr + col), tl.load(kw_ptr + col)).to(tl.float32)
            wr = tl.where(is_q, tl.load(qw_ptr + turned), tl.load(kw_ptr + turned)).to(tl.float32)
            x = tl.where(rotate, (xf * rstd[:, None] * w).to(x.dtype), x)
            xr = tl.where(rotate, (xr.to(tl.float32) * rstd[:, None] * wr).to(x.dtype), xr)
        c = tl.load(cos_ptr + token * D + col).to(tl.float32)
        s = tl.load(sin_ptr + token * D + col).to(tl.float32)
        a = (x.to(tl.float32) * c).to(x.dtype)
        r = (xr.to(tl.float32) * s).to(x.dtype)
        y = (a.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        result = tl.where(rotate, y, x)
        if STORE:
            kv = roped - queries
            row = tl.load(where_ptr + token).to(tl.int64) * kv * D
            is_k = (head >= queries) & rotate
            tl.store(k_ptr + row + (head - queries) * D + col, result, mask=is_k)
            tl.store(v_ptr + row + (head - roped) * D + col, result, mask=keep & (head >= roped))
            keep = head < queries
        tl.store(out_ptr + token * total * D + head * D + col, result, mask=keep)

    @triton.jit
    def _accept_commit_kernel(block_ptr, post_ptr, lens_ptr, rows_ptr, verify_ptr, tokens_ptr, cache_lens_ptr,
                              draft_lens_ptr, out_ptr, w, verified, max_len, block_stride, post_stride, tokens_stride,
                              W: tl.constexpr, HAS_VERIFY: tl.constexpr, HAS_DRAFT: tl.constexpr):
        """One row: the longest prefix of verified drafts equal to the target's tokens, the bonus token
        after it, and the row's writes."""
        row = tl.program_id(0)
        col = tl.arange(0, W)
        k = w - 1
        draft = tl.load(block_ptr + row * block_stride + 1 + col, mask=col < k, other=0)
        post = tl.load(post_ptr + row * post_stride + col, mask=col < w, other=0)
        match = (draft == post) & (col < k)
        if HAS_VERIFY:
            count = tl.load(verify_ptr + row)
            match = match & (col < count)
        else:
            count = verified
        accepted = tl.min(tl.where(match | (col >= k), k, col), axis=0)  # the first mismatch, or k
        bonus = tl.load(post_ptr + row * post_stride + accepted)
        emitted = tl.where((col == accepted) | (col == k), bonus, draft)
        base = out_ptr + row * (2 + w)
        tl.store(base, accepted)
        tl.store(base + 1, count)
        tl.store(base + 2 + col, emitted, mask=col < w)
        length = tl.load(lens_ptr + row)
        slot = tl.load(rows_ptr + row)
        tl.store(tokens_ptr + slot * tokens_stride + tl.minimum(length + 1 + col, max_len), emitted, mask=col < w)
        tl.store(cache_lens_ptr + slot, length + accepted + 1)
        if HAS_DRAFT:
            tl.store(draft_lens_ptr + slot, length + accepted + 1)
