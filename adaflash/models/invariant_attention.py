"""Batch-invariant attention (Triton): each query's result is the same bits however many rows, queries
and keys run beside it. Why batch invariance at all, and the rules every kernel here keeps (arguments
never specialized by shape, no FMA contraction): `invariant`.

A query's scores and weighted values are reduced in one fixed order whatever the pass: keys in steps of
`ATTN_KEYS` within chunks of `ATTN_CHUNK` at fixed positions, each chunk from its first key up, the
chunks merged from the first. Keys past a query's position are masked to exp(-inf) = 0, so a longer key
range (a larger context bucket) adds exact zeros, and a step whose keys no query of the tile may see is
not read. A pass may run the chunks one after another in one program or give each a program of its own
(decode at long contexts, where one program a row would leave the card idle, `split_keys`) and a query
gets the same bits either way. The mask's row stride is kept a multiple of 16 (`aligned_mask`): left at
the key count, a DFlash verify on a synthetic Qwen3-8B gave a query other bits than Vanilla's one-token
step, with the same q, k and v.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from adaflash.models import invariant
from adaflash.models.invariant import half_on_gpu
from adaflash.models.kernels import triton

if triton is not None:
    import triton.language as tl

ATTN_ROWS = 16  # attention tile rows (query × head-of-group pairs)
ATTN_KEYS = 64  # keys per step of attention's online softmax: fixed, so each query's sums run in one order
ATTN_CHUNK = 64  # keys per chunk: a query's keys are reduced chunk by chunk, the chunks merged from the first
SPLIT_BELOW = 2048  # a decode pass of fewer (row, kv head) programs gives each chunk of keys its own
SPLIT_VERIFY_BELOW = 64  # a pass of several queries a row, of fewer (row, kv head, tile) programs, likewise
PREFILL_ROWS = 64  # attention tile rows in a prompt's prefill (`prefill_tiles`)
VERIFY_ROWS = 32  # attention tile rows of a pass of several queries a row, where it gives ATTN_ROWS' bits
_TILE_ROWS: ContextVar[int | None] = ContextVar("attention_tile_rows", default=None)
_SAME_BITS: dict[tuple, bool] = {}  # (device, dtype, head size, group, mask dtype) -> VERIFY_ROWS agrees


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


def attention_available(head_dim: int, *tensors: torch.Tensor) -> bool:
    """Whether attention over `tensors` (q, k, v; or any of a pass's activations) runs here: a
    power-of-two head size, for the tile."""
    return half_on_gpu(*tensors) and head_dim >= 16 and head_dim & (head_dim - 1) == 0


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
    """Whether a pass gives each chunk of keys a program of its own (then merges them): a pass whose
    programs alone would leave the card's cores idle while each runs a long
    chain of key steps. Either way a query gets the same bits (`_merge` runs in one order over the
    same chunks), so this is chosen for speed alone. ADAFLASH_ATTN_SPLIT=0 or 1 forces it.

    Measured on an H100 (bf16, each call under a CUDA graph): SmolLM2's decode at batch 64, 256 and 512
    (1,280-key cache, rows of 100-600 keys) took 13.3, 40.2 and 76.4 µs split against 22.3, 53.6 and
    86.4 whole, Qwen3-8B's 9.4 against 25.8 at batch 1 and 62.5 against 74.4 at batch 64; verify passes
    gained nothing (8 queries at batch 256: 86.2 against 87.1) or lost (Qwen3-8B, 16 queries at batch 8:
    36.8 against 32.4, 256 programs). A verify pass of under `SPLIT_VERIFY_BELOW` programs (batch 1 to
    a few) splits too: a handful of programs on a card of 132 cores walk every key alone, and at 8B on an
    H100 a verify of 2 at batch 1 cost 0.73 ms more than the split decode step (7.24 against 6.51 ms), about
    what 36 layers of unsplit attention cost at batch 1 above."""
    forced = os.environ.get("ADAFLASH_ATTN_SPLIT", "auto").strip().lower()
    if forced in ("0", "1"):
        return forced == "1" and chunks > 1
    if forced != "auto":
        raise ValueError(f"ADAFLASH_ATTN_SPLIT={forced!r}: expected 0, 1 or auto")
    return chunks > 1 and programs < (SPLIT_BELOW if queries == 1 else SPLIT_VERIFY_BELOW)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              limit: torch.Tensor | None = None, *, tile_rows: int | None = None,
              tile_major: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ/√d + mask)·v for q [b, n, heads, d], k and v [b, s, kv, d] (heads a multiple of kv),
    mask [b, n, s]: bool (True = may attend) or additive. Returns [b, n, heads, d]; a query that may
    attend to nothing gets zeros. `limit` [b] (int32, optional): no query of row i sees a key at or
    past limit[i], so those are never read (a causal pass's last position + 1). `tile_rows`: (query, head)
    pairs a program takes [default: `PREFILL_ROWS` inside `prefill_tiles`, else `_pass_tile`]; `tile_major`:
    a row's tiles run next to each other (for speed measurements). Check `attention_available` first."""
    mask = aligned_mask(mask.expand(q.shape[0], q.shape[1], k.shape[1]))
    tile_rows = tile_rows or _TILE_ROWS.get() or _pass_tile(q, k, v, mask, limit)
    return _launch(q, k, v, mask, limit, tile_rows, tile_major, q.dtype)


def _pass_tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               limit: torch.Tensor | None) -> int:
    """`VERIFY_ROWS` for a pass whose (query, head) pairs a row fill more than one `ATTN_ROWS` tile (a
    verify of 8 queries on SmolLM2's groups of 3 takes two programs a kv head with 16) once it has given
    `ATTN_ROWS`' bits on the pass's first row (checked in float32 once per head size and group, outside
    graph capture; a tile that differs is never used), else `ATTN_ROWS`.

    Why it may agree: a tile's rows are independent in the tensor cores' product, and below 64 rows the
    same instructions run, so each query's sums keep their order. On an H100, SmolLM2's verify of 8 at
    batch 256 took 53 µs a layer against 74; 64-row tiles gave other bits there."""
    n, groups = q.shape[1], q.shape[2] // k.shape[2]
    if n * groups <= ATTN_ROWS or invariant.TILES_FIXED:
        return ATTN_ROWS
    key = (q.device, q.dtype, q.shape[-1], groups, mask.dtype)
    if key not in _SAME_BITS:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            return ATTN_ROWS
        first = None if limit is None else limit[:1]
        probe = [_launch(q[:1], k[:1], v[:1], mask[:1], first, rows, False, torch.float32)
                 for rows in (VERIFY_ROWS, ATTN_ROWS)]
        _SAME_BITS[key] = torch.equal(*probe)
    return VERIFY_ROWS if _SAME_BITS[key] else ATTN_ROWS


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, limit: torch.Tensor | None,
            tile_rows: int, tile_major: bool, dtype: torch.dtype) -> torch.Tensor:
    b, n, heads, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    groups = heads // kv
    out = torch.empty(b, n, heads, d, device=q.device, dtype=dtype)
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
