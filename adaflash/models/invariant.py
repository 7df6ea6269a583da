"""Batch-invariant GPU kernels (Triton): GEMM, RMSNorm and attention whose every row's result is
the same bits however many rows run beside it.

Why: speculative decoding is lossless only if the target's verify pass (k+1 tokens a row, rows of
a batch together) computes each token's logits exactly as Vanilla's one-token pass does. In bf16,
torch's kernels do not: cuBLAS picks a GEMM algorithm (tile, split-K) by the number of rows, the
reductions of RMSNorm and attention change their split with the shape, and near-ties in the argmax
then go the other way. Here each output element is reduced in one fixed order whatever the number of
rows, queries or keys: the GEMM's sum over k runs in the tensor cores' order from 0 up whatever its
tile (so the tile may follow the row count for speed, `mm_tiles`; `mm` checks that a tile gives the
base tile's bits before it uses it), the norm's by the row's width, attention's by the head size.
Keys past a query's position are masked to exp(-inf) = 0, so a longer key range (a larger context
bucket) adds exact zeros. Attention reduces a query's keys in chunks of `ATTN_CHUNK` at fixed
positions, each chunk from its first key up, and merges the chunks from the first: a pass may run the
chunks one after another in one program or give each a program of its own (decode at long contexts,
where one program a row would leave the card idle) and a query gets the same bits either way.

Triton compiles a variant of a kernel for each pattern of its integer arguments (and pointers) that
are 1 or divide by 16, and variants may reduce in different orders (the layout a sum runs in follows
how the loads beside it were vectorized). An argument that varies with the pass's shape therefore
either is never specialized (`do_not_specialize`: rows, queries, keys) or is kept a multiple of 16:
attention's mask, whose row stride is the key count, is padded to one (`aligned_mask`). With the
stride left at the key count, a DFlash verify on a synthetic Qwen3-8B gave a query other bits than
Vanilla's one-token step, with the same q, k and v.

Every launch turns off the compiler's contraction of a multiply and an add into one FMA
(`enable_fp_fusion=False`): whether it contracts can differ between the variants Triton compiles for
different argument values, and an FMA rounds once where the two operations round twice.

bf16/fp16 on CUDA outside autograd with Triton on (`kernels.fusable`); float32, CPUs and training
run torch's ops (the float32 paths were already exact, per the lossless tests).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from adaflash.models.kernels import fusable, triton

if triton is not None:
    import triton.language as tl

ATTN_ROWS = 16  # attention tile rows (query × head-of-group pairs)
ATTN_KEYS = 64  # keys per step of attention's online softmax: fixed, so each query's sums run in one order
ATTN_CHUNK = 64  # keys per chunk: a query's keys are reduced chunk by chunk, the chunks merged from the first
SPLIT_BELOW = 2048  # a decode pass of fewer (row, kv head) programs gives each chunk of keys its own
PREFILL_ROWS = 64  # attention tile rows in a prompt's prefill (`prefill_tiles`)
_TILE_ROWS: ContextVar[int] = ContextVar("attention_tile_rows", default=ATTN_ROWS)


@contextmanager
def prefill_tiles() -> Iterator[None]:
    """Within it, attention gives each program `PREFILL_ROWS` (query, head) pairs: the target's prefill
    passes, and nothing else, run inside it.

    Why: a program reads its row's keys and values again for every tile of queries, and a prefill has
    hundreds of queries a row (an H200 spent 27% of a 65,536-token prefill in attention with 16-pair
    tiles). Why only there: a tile's size may change how a query's sums are laid out, so a decode step
    and a verify pass, whose queries must match bit for bit, keep `ATTN_ROWS`; a prompt's positions are
    only ever computed by a prefill, and every prefill (any padding, any companions, replayed or eager)
    takes the same tile, so a prompt's keys and first token keep their bits whatever is admitted with it."""
    token = _TILE_ROWS.set(PREFILL_ROWS)
    try:
        yield
    finally:
        _TILE_ROWS.reset(token)



def _half(*tensors: torch.Tensor | None) -> bool:
    """All bf16 or all fp16, on the GPU, none needing a gradient (the kernels have no backward: a
    drafter's weights in training must not pass through them, whatever their inputs)."""
    given = [t for t in tensors if t is not None]
    return given[0].dtype in (torch.bfloat16, torch.float16) \
        and all(t.dtype == given[0].dtype and fusable(t) for t in given)


def mm_available(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    return _half(x, weight, bias)


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
    if _TILES_FIXED:
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
    """ADAFLASH_MM_TILES=base runs every GEMM with its base tile: to compare speed, or around a GPU whose
    tiles would round otherwise (`mm` already falls back there)."""
    value = os.environ.get("ADAFLASH_MM_TILES", "auto").strip().lower()
    if value not in ("auto", "base"):
        raise ValueError(f"ADAFLASH_MM_TILES={value!r}: expected auto or base")
    return value == "base"


_TILES_FIXED = _tiles_fixed()


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


ALIGN = 16  # Triton's specialization divisor


def aligned_width(keys: int) -> int:
    """`keys` rounded up to a multiple of `ALIGN`: the row stride of a mask the kernel takes as it is."""
    return -(-keys // ALIGN) * ALIGN


def aligned_mask(mask: torch.Tensor) -> torch.Tensor:
    """`mask` [b, n, s] with its batch and query strides multiples of `ALIGN` (a view into a padded
    buffer where they are not), so that every attention pass runs the same compiled variant."""
    b, n, s = mask.shape
    if mask.stride(2) == 1 and mask.stride(0) % ALIGN == 0 and mask.stride(1) % ALIGN == 0:
        return mask
    out = mask.new_empty(b, n, aligned_width(s))[:, :, :s]
    out.copy_(mask)
    return out


def split_keys(programs: int, chunks: int, queries: int = 1) -> bool:
    """Whether a pass gives each chunk of keys a program of its own (then merges them): a decode pass
    (one query a row) whose programs alone would leave the card's cores idle while each runs a long
    chain of key steps. Either way a query gets the same bits (`_merge` runs in one order over the
    same chunks), so this is chosen for speed alone. ADAFLASH_ATTN_SPLIT=0 or 1 forces it.

    Measured on an H100 (bf16, each call under a CUDA graph): SmolLM2's decode at batch 64, 256 and 512
    (1,280-key cache, rows of 100-600 keys) took 13.3, 40.2 and 76.4 µs split against 22.3, 53.6 and
    86.4 whole, Qwen3-8B's 9.4 against 25.8 at batch 1 and 62.5 against 74.4 at batch 64; verify passes
    gained nothing (8 queries at batch 256: 86.2 against 87.1) or lost (Qwen3-8B, 16 queries at batch 8:
    36.8 against 32.4)."""
    forced = os.environ.get("ADAFLASH_ATTN_SPLIT", "auto").strip().lower()
    if forced in ("0", "1"):
        return forced == "1" and chunks > 1
    if forced != "auto":
        raise ValueError(f"ADAFLASH_ATTN_SPLIT={forced!r}: expected 0, 1 or auto")
    return chunks > 1 and queries == 1 and programs < SPLIT_BELOW


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              limit: torch.Tensor | None = None, *, tile_rows: int | None = None,
              tile_major: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ/√d + mask)·v for q [b, n, heads, d], k and v [b, s, kv, d] (heads a multiple of kv),
    mask [b, n, s]: bool (True = may attend) or additive. Returns [b, n, heads, d]; a query that may
    attend to nothing gets zeros. `limit` [b] (int32, optional): no query of row i sees a key at or
    past limit[i], so those are never read (a causal pass's last position + 1). `tile_rows`: (query, head)
    pairs a program takes [default: `ATTN_ROWS`, `PREFILL_ROWS` inside `prefill_tiles`]; `tile_major`:
    a row's tiles run next to each other (for speed measurements). Check `attention_available` first."""
    tile_rows = tile_rows or _TILE_ROWS.get()
    b, n, heads, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    groups = heads // kv
    mask = aligned_mask(mask.expand(b, n, s))
    out = torch.empty(b, n, heads, d, device=q.device, dtype=q.dtype)
    tiles = triton.cdiv(n * groups, tile_rows)
    chunks = triton.cdiv(s, ATTN_CHUNK)
    lim = out if limit is None else limit  # without a limit the pointer is never read
    common = dict(GROUPS=groups, D=d, BM=tile_rows, CHUNK=ATTN_CHUNK, HAS_LIMIT=limit is not None,
                  num_warps=4, enable_fp_fusion=False)
    args = (q, k, v, mask, lim, n, s, 1.0 / math.sqrt(d), *q.stride(), *k.stride(), *v.stride(), *mask.stride())
    shapes = dict(common, BN=ATTN_KEYS, BOOL_MASK=mask.dtype == torch.bool)
    if not split_keys(b * kv * tiles, chunks, n):
        grid = (tiles, kv, b) if tile_major else (b, kv, tiles)
        _attention_kernel[grid](*args, out, *out.stride(), TILE_MAJOR=tile_major, **shapes)
        return out
    top = torch.empty(b, kv, tiles * tile_rows, chunks, device=q.device, dtype=torch.float32)
    total = torch.empty_like(top)
    acc = torch.empty(*top.shape, d, device=q.device, dtype=torch.float32)
    _attention_chunk_kernel[(b, kv, tiles * chunks)](*args, top, total, acc, chunks, **shapes)
    _attention_merge_kernel[(b, kv, tiles)](top, total, acc, lim, out, n, s, chunks, *out.stride(), **common)
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


    @triton.jit
    def _row_limit(lim_ptr, b, s, HAS_LIMIT: tl.constexpr):
        """Keys of row `b` any query may see end before this."""
        if HAS_LIMIT:
            return tl.minimum(tl.load(lim_ptr + b), s)
        return s

    @triton.jit
    def _pairs(GROUPS: tl.constexpr, BM: tl.constexpr, tile, kv):
        """A tile's (query, head) pairs: BM of them, the heads of kv head `kv`'s group, query by query."""
        pair = tile * BM + tl.arange(0, BM)
        return pair, pair // GROUPS, kv * GROUPS + pair % GROUPS

    @triton.jit
    def _chunk_state(q, k_ptr, v_ptr, mask_ptr, b, kv, query, live, lo, end, scale,
                     skb, sks, skh, skd, svb, svs, svh, svd, smb, smn, sms,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BOOL_MASK: tl.constexpr):
        """Online softmax over keys [lo, end) in BN steps from lo up: the running maximum, the sum of
        weights and the weighted sum of values, unnormalized.

        A step whose keys no live query may see reads no keys or values: through the online softmax
        such a step adds exactly nothing (its weights are exp(-inf) = 0 and the maximum stays)."""
        dims = tl.arange(0, D)
        top = tl.full((BM,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, D), dtype=tl.float32)
        for start in range(lo, end, BN):
            keys = start + tl.arange(0, BN)
            inside = keys < end
            bias = tl.load(mask_ptr + b * smb + query[:, None] * smn + keys[None, :] * sms,
                           mask=live[:, None] & inside[None, :], other=0)
            if BOOL_MASK:
                seen = bias != 0
            else:
                seen = bias.to(tl.float32) != float("-inf")
            if tl.max((seen & live[:, None] & inside[None, :]).to(tl.int32)) > 0:
                kt = tl.load(k_ptr + b * skb + keys[None, :] * sks + kv * skh + dims[:, None] * skd,
                             mask=inside[None, :], other=0.0)
                scores = tl.dot(q, kt) * scale
                if BOOL_MASK:
                    scores = tl.where(seen, scores, float("-inf"))
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
        return top, total, acc

    @triton.jit
    def _merge(top, total, acc, c_top, c_total, c_acc):
        """The running state of the chunks so far and the next chunk's, as one: the only way chunks
        combine, in the split pass and the whole one alike, so both give the same bits."""
        new_top = tl.maximum(top, c_top)
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)
        mine = tl.exp(top - shift)
        theirs = tl.exp(c_top - shift)
        return new_top, total * mine + c_total * theirs, acc * mine[:, None] + c_acc * theirs[:, None]

    @triton.jit
    def _store_result(out_ptr, acc, total, b, query, head, live, sob, son, soh, sod, D: tl.constexpr):
        dims = tl.arange(0, D)
        result = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out_ptr + b * sob + query[:, None] * son + head[:, None] * soh + dims[None, :] * sod,
                 result.to(out_ptr.dtype.element_ty), mask=live[:, None])

    @triton.jit
    def _load_q(q_ptr, b, query, head, live, sqb, sqn, sqh, sqd, D: tl.constexpr):
        dims = tl.arange(0, D)
        return tl.load(q_ptr + b * sqb + query[:, None] * sqn + head[:, None] * sqh + dims[None, :] * sqd,
                       mask=live[:, None], other=0.0)

    @triton.jit(do_not_specialize=["n", "s"])
    def _attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, lim_ptr, n, s, scale,
                          sqb, sqn, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, smb, smn, sms,
                          out_ptr, sob, son, soh, sod,
                          GROUPS: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          CHUNK: tl.constexpr, BOOL_MASK: tl.constexpr, HAS_LIMIT: tl.constexpr,
                          TILE_MAJOR: tl.constexpr):
        """One kv head of one row, BM (query, head of the group) pairs, its chunks of keys one after another."""
        b = tl.program_id(2) if TILE_MAJOR else tl.program_id(0)
        kv = tl.program_id(1)
        pair, query, head = _pairs(GROUPS, BM, tl.program_id(0) if TILE_MAJOR else tl.program_id(2), kv)
        live = query < n
        q = _load_q(q_ptr, b, query, head, live, sqb, sqn, sqh, sqd, D)
        lim = _row_limit(lim_ptr, b, s, HAS_LIMIT)
        top = tl.full((BM,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, D), dtype=tl.float32)
        for lo in range(0, lim, CHUNK):
            c_top, c_total, c_acc = _chunk_state(q, k_ptr, v_ptr, mask_ptr, b, kv, query, live, lo,
                                                 tl.minimum(lo + CHUNK, lim), scale, skb, sks, skh, skd,
                                                 svb, svs, svh, svd, smb, smn, sms, D, BM, BN, BOOL_MASK)
            top, total, acc = _merge(top, total, acc, c_top, c_total, c_acc)
        _store_result(out_ptr, acc, total, b, query, head, live, sob, son, soh, sod, D)

    @triton.jit(do_not_specialize=["n", "s", "chunks"])
    def _attention_chunk_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, lim_ptr, n, s, scale,
                                sqb, sqn, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, smb, smn, sms,
                                top_ptr, total_ptr, acc_ptr, chunks,
                                GROUPS: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                CHUNK: tl.constexpr, BOOL_MASK: tl.constexpr, HAS_LIMIT: tl.constexpr):
        """One chunk of keys for one tile: its state, unnormalized, for `_attention_merge_kernel`."""
        b = tl.program_id(0)
        kv = tl.program_id(1)
        tile = tl.program_id(2) // chunks
        chunk = tl.program_id(2) % chunks
        pair, query, head = _pairs(GROUPS, BM, tile, kv)
        live = query < n
        lim = _row_limit(lim_ptr, b, s, HAS_LIMIT)
        lo = chunk * CHUNK
        if lo < lim:
            q = _load_q(q_ptr, b, query, head, live, sqb, sqn, sqh, sqd, D)
            c_top, c_total, c_acc = _chunk_state(q, k_ptr, v_ptr, mask_ptr, b, kv, query, live, lo,
                                                 tl.minimum(lo + CHUNK, lim), scale, skb, sks, skh, skd,
                                                 svb, svs, svh, svd, smb, smn, sms, D, BM, BN, BOOL_MASK)
            tiles = tl.num_programs(2) // chunks
            at = ((b * tl.num_programs(1) + kv) * tiles * BM + pair) * chunks + chunk
            tl.store(top_ptr + at, c_top, mask=live)  # a decode tile's dead pairs (most of it) write nothing
            tl.store(total_ptr + at, c_total, mask=live)
            tl.store(acc_ptr + at[:, None] * D + tl.arange(0, D)[None, :], c_acc, mask=live[:, None])

    @triton.jit(do_not_specialize=["n", "s", "chunks"])
    def _attention_merge_kernel(top_ptr, total_ptr, acc_ptr, lim_ptr, out_ptr, n, s, chunks, sob, son, soh, sod,
                                GROUPS: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, CHUNK: tl.constexpr,
                                HAS_LIMIT: tl.constexpr):
        """A tile's chunks merged from the first up, as `_attention_kernel` merges them."""
        b = tl.program_id(0)
        kv = tl.program_id(1)
        tile = tl.program_id(2)
        pair, query, head = _pairs(GROUPS, BM, tile, kv)
        live = query < n
        lim = _row_limit(lim_ptr, b, s, HAS_LIMIT)
        top = tl.full((BM,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, D), dtype=tl.float32)
        base = ((b * tl.num_programs(1) + kv) * tl.num_programs(2) * BM + pair) * chunks
        for chunk in range(0, tl.cdiv(lim, CHUNK)):
            at = base + chunk
            c_top = tl.load(top_ptr + at, mask=live, other=float("-inf"))
            c_total = tl.load(total_ptr + at, mask=live, other=0.0)
            c_acc = tl.load(acc_ptr + at[:, None] * D + tl.arange(0, D)[None, :], mask=live[:, None], other=0.0)
            top, total, acc = _merge(top, total, acc, c_top, c_total, c_acc)
        _store_result(out_ptr, acc, total, b, query, head, live, sob, son, soh, sod, D)
