"""Attention for decoding on a CPU that gives each query the same bits in any pass.

Speculative decoding is lossless only if a position verified in a block of 9 gets the logits Vanilla's
one-token step gave it, and a row of a batch the logits it gets alone; the GPU has batch-invariant kernels for
that (`invariant`), and this is the CPU's, for float32 and bf16 alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cpu_row_invariant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention whose every query keeps its bits whatever the queries and keys beside it (on a CPU):
    q [b, q, h, d], k and v [b, s, kv, d], mask [b, q, s] → [b, q, h, d], in float32 throughout.

    Why: a verify pass attends 9 queries over s + 8 keys where Vanilla attends 1 over s, and on a CPU
    SDPA rounds a query by how many come with it; in bf16 that flips a bit of a layer's output and, a
    few layers on, greedy tokens. So every product here has a fixed shape: a group's queries go in
    columns of exactly 32 (zeros fill the last), the scores K @ Qᵀ reduce over the head dim only, and the
    values are summed in pieces of 64 keys, each piece one product, the pieces added in order. Masked
    keys past a query's own then add exact zeros at the end, and MKL gives a column the same bits.
    """
    b, nq, heads, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    groups, cols, pieces = heads // kv, heads // kv * nq, -(-s // KEY_PIECE)
    chunks = -(-cols // QUERY_COLUMNS)
    rows = b * kv * chunks  # one product per kv head, batch row and chunk of 32 query columns

    def padded(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        return F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, size - x.shape[dim]])

    queries = q.float().reshape(b, nq, kv, groups, d).permute(0, 2, 3, 1, 4).reshape(b * kv, cols, d)
    queries = padded(queries, 1, chunks * QUERY_COLUMNS).view(rows, QUERY_COLUMNS, d)
    keys = k.float().permute(0, 2, 1, 3).reshape(b * kv, 1, s, d).expand(-1, chunks, -1, -1).reshape(rows, s, d)
    scores = torch.bmm(keys, queries.transpose(1, 2))  # [rows, s, 32]
    scores = scores.view(b * kv, chunks, s, QUERY_COLUMNS).permute(0, 2, 1, 3).reshape(b * kv, s, -1)[..., :cols]
    scores = scores.view(b, kv, s, groups, nq).permute(0, 1, 3, 4, 2) * d ** -0.5  # [b, kv, groups, q, s]
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    else:
        scores = scores + mask[:, None, None].float()
    probs = padded(torch.softmax(scores, dim=-1).reshape(b * kv, cols, s), 1, chunks * QUERY_COLUMNS)
    probs = padded(probs, 2, pieces * KEY_PIECE).view(rows, QUERY_COLUMNS, pieces, KEY_PIECE)
    probs = probs.permute(0, 2, 3, 1).reshape(rows * pieces, KEY_PIECE, QUERY_COLUMNS)
    values = padded(v.float().permute(0, 2, 3, 1), 3, pieces * KEY_PIECE)  # [b, kv, d, keys]
    values = values.reshape(b * kv, 1, d, pieces, KEY_PIECE).expand(-1, chunks, -1, -1, -1)
    values = values.permute(0, 1, 3, 2, 4).reshape(rows * pieces, d, KEY_PIECE)
    out = torch.bmm(values, probs).view(rows, pieces, d, QUERY_COLUMNS).cumsum(1)[:, -1]  # in order
    out = out.view(b * kv, chunks, d, QUERY_COLUMNS).permute(0, 2, 1, 3).reshape(b * kv, d, -1)[..., :cols]
    return out.view(b, kv, d, groups, nq).permute(0, 4, 1, 3, 2).reshape(b, nq, heads, d).to(q.dtype)


QUERY_COLUMNS = 32  # the column count of every attention product on a CPU in bf16/fp16
KEY_PIECE = 64  # the keys each of its value products sums over
DECODE_QUERIES = 64  # passes of at most this many queries a row (decode, verify) keep each row's bits on a CPU
