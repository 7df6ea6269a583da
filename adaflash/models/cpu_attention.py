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
    chunks of exactly 32 (zeros fill the last), the scores K @ Qᵀ reduce over the head dim only, and the
    values are summed in pieces of 64 keys, each piece one [32, 64] @ [64, d] product, the pieces added
    in order in float64 (as a cumulative sum would). Masked keys past a query's own then add exact zeros
    at the end, and MKL gives a query the same bits. The keys, too, are padded to whole pieces, so the
    scores' product has as many rows and the softmax as many columns whatever a query can see: MKL
    rounds a product of 1 to 3 rows otherwise than a longer one, and torch's softmax sums a row of 3 to
    15 in another order than the same row followed by masked keys (a one-token step early in an answer
    then parted from the verify pass that checked its position). K and V are each copied once, to
    float32 in the [kv head, key, d] layout both products read: at batch 32 the copies, not the products,
    had taken most of a decode step.
    """
    b, nq, heads, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    groups, cols, pieces = heads // kv, heads // kv * nq, -(-s // KEY_PIECE)
    chunks, heads_kv = -(-cols // QUERY_COLUMNS), b * kv
    width = chunks * QUERY_COLUMNS
    grouped = q.reshape(b, nq, kv, groups, d).permute(0, 2, 3, 1, 4).reshape(heads_kv, cols, d)
    queries = q.new_zeros((chunks, heads_kv, QUERY_COLUMNS, d), dtype=torch.float32)  # each chunk contiguous
    for c in range(chunks):
        part = grouped[:, c * QUERY_COLUMNS:(c + 1) * QUERY_COLUMNS]
        queries[c, :, :part.shape[1]] = part
    padded = pieces * KEY_PIECE
    keys = k.new_empty((heads_kv, padded, d), dtype=torch.float32)
    keys.view(b, kv, padded, d)[:, :, :s].copy_(k.permute(0, 2, 1, 3))
    keys[:, s:].zero_()
    scores = [torch.bmm(keys, queries[c].transpose(1, 2)) for c in range(chunks)]  # each [b·kv, padded, 32]
    scores = (scores[0] if chunks == 1 else torch.cat(scores, -1))[..., :cols]
    scores = scores.view(b, kv, padded, groups, nq).permute(0, 1, 3, 4, 2) * d ** -0.5  # [b, kv, groups, q, padded]
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    bias = F.pad(mask.float(), (0, padded - s), value=float("-inf"))  # the padding keys are masked too
    probs = q.new_zeros((heads_kv, width, padded), dtype=torch.float32)
    probs[:, :cols] = torch.softmax(scores + bias[:, None, None], dim=-1).reshape(heads_kv, cols, padded)
    values = v.new_empty((heads_kv, padded, d), dtype=torch.float32)
    values.view(b, kv, -1, d)[:, :, :s].copy_(v.permute(0, 2, 1, 3))
    values[:, s:].zero_()
    values = values.view(heads_kv * pieces, KEY_PIECE, d)
    out = []
    for c in range(chunks):
        chunk = probs[:, c * QUERY_COLUMNS:(c + 1) * QUERY_COLUMNS].view(heads_kv, QUERY_COLUMNS, pieces, KEY_PIECE)
        chunk = chunk.permute(0, 2, 1, 3).reshape(heads_kv * pieces, QUERY_COLUMNS, KEY_PIECE)
        parts = torch.bmm(chunk, values).view(heads_kv, pieces, QUERY_COLUMNS, d)
        total = parts[:, 0].double()
        for piece in range(1, pieces):
            total += parts[:, piece]
        out.append(total.float())
    out = (out[0] if chunks == 1 else torch.cat(out, 1))[:, :cols]  # [b·kv, cols, d]
    return out.reshape(b, kv, groups, nq, d).permute(0, 3, 1, 2, 4).reshape(b, nq, heads, d).to(q.dtype)


QUERY_COLUMNS = 32  # the column count of every attention product on a CPU in bf16/fp16
KEY_PIECE = 64  # the keys each of its value products sums over
DECODE_QUERIES = 64  # passes of at most this many queries a row (decode, verify) keep each row's bits on a CPU
