"""The DFlash objective: random anchors, [anchor, MASK × (B-1)] blocks, block attention, decayed CE/KL.

One block per anchor `a`: position k of the block sits at absolute position a + k and predicts
the token there (k = 0 is the clean anchor and predicts nothing). Its queries see the target
context strictly before the anchor and the whole of their own block, exactly as at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from adaflash.models.drafters import DFlashDrafter
from adaflash.models.target import TargetModel
from adaflash.train.features import FeatureSource, direct_features, greedy_tokens, teacher_logits
from adaflash.train.losses import LossConfig, distill_loss, position_decay, to_draft_vocab


@dataclass
class BlockBatch:
    anchors: torch.Tensor  # [b, n]
    valid: torch.Tensor  # [b, n] the anchor is real (rows with few candidates repeat one, masked out)


def sample_anchors(lens: torch.Tensor, starts: torch.Tensor, per_seq: int, gen: torch.Generator) -> BlockBatch:
    """Up to `per_seq` distinct anchors per row among its response positions start..len-2, sorted.

    Drawn for the whole batch at once (random keys, the smallest first), not a loop over rows: a step
    on a GPU is short enough that a few host ops per row showed. A row with no candidate gets one
    anchor at max(len - 2, 0); a row with fewer candidates than the others repeats its first anchor,
    masked out by `valid`.
    """
    lens_h, starts_h = lens.cpu(), starts.cpu()
    end = torch.maximum(starts_h, lens_h - 1)  # candidates start..end-1
    count = end - starts_h
    width = max(int(end.max()), 1)
    positions = torch.arange(width)
    inside = (positions[None, :] >= starts_h[:, None]) & (positions[None, :] < end[:, None])
    keys = torch.rand(len(lens_h), width, generator=gen).masked_fill(~inside, 2.0)
    n = max(1, min(per_seq, int(count.max())))
    pick = keys.topk(n, dim=1, largest=False).indices
    kept = count.clamp(min=1, max=n)
    valid = torch.arange(n)[None, :] < kept[:, None]
    pick[:, 0] = torch.where(count > 0, pick[:, 0], (lens_h - 2).clamp(min=0))
    pick = torch.where(valid, pick, width).sort(dim=1).values
    anchors = torch.where(valid, pick, pick[:, :1])
    return BlockBatch(anchors.to(lens.device), valid.to(lens.device))


def block_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> torch.Tensor:
    """[b, n·B, ctx + n·B]: context keys before the query's anchor, keys of its own block."""
    b, n = anchors.shape
    device = anchors.device
    query_anchor = anchors.repeat_interleave(block, dim=1)  # [b, nB]
    ctx = torch.arange(ctx_len, device=device)[None, None, :] < query_anchor[:, :, None]
    qb = torch.arange(n * block, device=device) // block
    own = (qb[:, None] == qb[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], dim=-1)


def greedy_chain_mask(answer: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """[b, n, B]: the block positions that learn the target's greedy token `greedy` (its choice after
    the previous position), given the row's tokens `answer` there.

    Position k learns only if the answer took the greedy token at every position 1..k-1: past the
    first departure the row's context is no longer the one greedy decoding would have, so its label
    teaches nothing a verifier accepts.
    """
    follows = (answer == greedy)[..., 1:-1].long()
    ones = torch.ones_like(answer[..., :2], dtype=torch.long)
    return torch.cat([ones, follows.cumprod(-1)], dim=-1).bool()


def block_acceptance(hit: torch.Tensor, in_block: torch.Tensor, learned: torch.Tensor, whole: torch.Tensor,
                     room: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts of each block [b, n] that greedy verification would accept, and whether that count is known.

    `hit`, `in_block`, `learned` are [b, n, B-1] over positions 1..B-1: the draft equals the target's
    token; the position lies inside the row; it was learned (on a greedy chain, only up to a departure).
    `whole` marks blocks inside their row, `room` the tokens after each anchor. A count is known
    unless every learned draft hit and the chain ended before the block did: what follows is unseen.
    """
    accepted = (hit | ~in_block).long().cumprod(-1).sum(-1)
    accepted = torch.minimum(accepted, room)
    known = whole & ((accepted < learned.sum(-1)) | learned.all(-1))
    return accepted, known


def dflash_loss(
    drafter: DFlashDrafter,
    target: TargetModel,
    ids: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    *,
    blocks_per_seq: int,
    loss_cfg: LossConfig,
    gen: torch.Generator,
    train_head: bool = False,
    features: FeatureSource | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of the drafter (plus the length head's MSE when asked) on one batch of sequences."""
    size = drafter.block_size
    b, width = ids.shape
    device = ids.device
    source = features or direct_features(target, drafter.target_layer_ids)
    # The length head learns the acceptance against the target's greedy token; a memo knows those
    # tokens already, so CE training then needs no teacher logits at all.
    chain = loss_cfg.greedy_chain
    greedy = getattr(source, "greedy", None) if (train_head and loss_cfg.kind == "ce") or chain else None
    need_teacher = loss_cfg.kind != "ce" or (train_head and greedy is None)
    feats, final = source(ids, lens, need_teacher or (chain and greedy is None))
    # the target's greedy token after each position [b, width], where the head or the chain asks for it
    greedy_ids = None
    if greedy is not None:
        greedy_ids = greedy(ids, lens)
    elif chain:
        greedy_ids = greedy_tokens(target, final.flatten(0, 1)).view(b, width)
    blocks = sample_anchors(lens, starts, blocks_per_seq, gen)
    n = blocks.anchors.shape[1]
    k = torch.arange(size, device=device)
    pos = blocks.anchors[:, :, None] + k  # [b, n, B]
    before_pos = (pos - 1).clamp(min=0, max=width - 1)  # the position whose target output predicts each one
    in_seq = pos < lens[:, None, None]
    labels = ids.gather(1, pos.clamp(max=width - 1).flatten(1)).view(b, n, size)
    live = in_seq & (k > 0) & blocks.valid[:, :, None]
    in_block = live  # what acceptance counts over: a position off the greedy chain ends it as a miss
    if chain:
        greedy_at = greedy_ids.gather(1, before_pos.flatten(1)).view(b, n, size)
        live = live & greedy_chain_mask(labels, greedy_at)
        labels = greedy_at
    anchor_tokens = ids.gather(1, blocks.anchors)
    h = torch.cat([target.embed(anchor_tokens)[:, :, None].to(drafter.fc.weight.dtype),
                   drafter.mask_embeds(target, (b, n, size - 1)).to(drafter.fc.weight.dtype)], dim=2)
    ctx = drafter.context(feats.to(drafter.fc.weight.dtype))
    ctx_kv = drafter.context_kv(ctx, torch.arange(width, device=device).expand(b, width))
    hidden = drafter.run_block(h.view(b, n * size, -1), pos.view(b, n * size), ctx_kv,
                               block_mask(blocks.anchors, width, size))
    sel = live.flatten()
    flat_hidden = hidden.reshape(b * n * size, -1)
    student = drafter.draft_logits(flat_hidden[sel], target)
    weights = position_decay(size, loss_cfg.gamma, device).expand(b, n, size).flatten()[sel]
    rows = torch.arange(b, device=device)[:, None, None].expand(b, n, size).flatten()[sel]  # each one's row
    before = before_pos.flatten()[sel]
    teacher = teacher_logits(target, final, rows, before) if need_teacher else None
    chosen = labels.flatten()[sel]
    d_labels, d_teacher, weights = to_draft_vocab(drafter.draft_vocab, target.cfg.vocab_size, chosen, teacher, weights)
    loss, stats = distill_loss(student, d_labels, d_teacher, weights,
                               loss_cfg if loss_cfg.kind != "ce" else LossConfig("ce", gamma=loss_cfg.gamma))
    # acceptance under greedy verification, from teacher forcing: the cheap τ proxy
    with torch.no_grad():
        if teacher is not None:
            reference = teacher.argmax(-1)
        elif greedy_ids is not None:
            reference = greedy_ids[rows, before]
        else:
            reference = chosen
        hit = torch.zeros(b * n * size, dtype=torch.bool, device=device)
        hit[sel] = drafter.to_target_ids(student.argmax(-1)) == reference
        hit = hit.view(b, n, size)[:, :, 1:]
        accepted, full = block_acceptance(hit, in_block[:, :, 1:], live[:, :, 1:], in_seq.all(-1) & blocks.valid,
                                          (lens[:, None] - blocks.anchors - 1).clamp(min=0))
        stats["block_accept_len"] = float((accepted[full].float() + 1).mean()) if bool(full.any()) else 0.0
        stats["top1"] = float(hit.flatten()[live[:, :, 1:].flatten()].float().mean())
    if train_head and drafter.length_head is not None and bool(full.any()):
        predicted = drafter.length_head(hidden.view(b, n, size, -1)[full])
        label = (accepted[full].float() + 1) / size
        head_loss = F.mse_loss(predicted.float(), label)
        stats["loss_length_head"] = float(head_loss.detach())
        stats["length_head_mae_tokens"] = float((predicted.detach().float() - label).abs().mean() * size)
        loss = loss + head_loss
    stats["loss"] = float(loss.detach())
    return loss, stats
