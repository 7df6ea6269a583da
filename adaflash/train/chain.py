"""Training-time test for chain drafters (EAGLE-3, MTP): unroll the chain as inference runs it.

Drafter position p reads (feature_p, token_{p+1}) and predicts token_{p+2}. Unrolled step t at
position p stands for a chain whose context ends at p - t: it sees step-0 keys at positions
≤ p - t and, for each step s ≤ t, the one key at p - t + s; its feature input is step t-1's
output at p - 1. Step t's loss is weighted `step_weight ** t`.
"""

from __future__ import annotations

import torch

from adaflash.models.drafters import ChainDrafter
from adaflash.models.target import TargetModel
from adaflash.train.features import FeatureSource, direct_features, teacher_logits
from adaflash.train.losses import LossConfig, distill_loss, to_draft_vocab


def ttt_mask(width: int, step: int, device: torch.device) -> torch.Tensor:
    """[width, (step + 1) · width] visibility for the queries of unrolled step `step`."""
    p = torch.arange(width, device=device)[:, None]
    j = torch.arange(width, device=device)[None, :]
    parts = [j <= p - step]
    parts += [j == p - step + s for s in range(1, step + 1)]
    return torch.cat(parts, dim=1)


def chain_loss(
    drafter: ChainDrafter,
    target: TargetModel,
    ids: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    *,
    ttt_length: int,
    loss_cfg: LossConfig,
    step_weight: float = 0.8,
    features: FeatureSource | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    b, width = ids.shape
    device = ids.device
    span = width - 2  # positions p with a label at p + 2
    if span <= 0:
        raise ValueError("sequences are too short for chain training (need 3 tokens)")
    need_teacher = loss_cfg.kind != "ce"
    feats, final = (features or direct_features(target, drafter.target_layer_ids))(ids, lens, need_teacher)
    dtype = drafter.norm.weight.dtype
    emb = target.embed(ids[:, 1: span + 1]).to(dtype)
    positions = torch.arange(span, device=device).expand(b, span)
    labels = ids[:, 2: span + 2]
    p = torch.arange(span, device=device)[None, :]
    label_ok = (p + 2 < lens[:, None]) & (p + 2 >= starts[:, None])
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    total = torch.zeros((), device=device)
    stats: dict[str, float] = {}
    norm = 0.0
    h_prev: torch.Tensor | None = None
    for step in range(ttt_length):
        if step == 0:
            u, resid = drafter.fuse(emb, feats[:, :span].to(dtype), from_target=True)
        else:
            shifted = torch.cat([torch.zeros_like(h_prev[:, :1]), h_prev[:, :-1]], dim=1)
            u, resid = drafter.fuse(emb, shifted, from_target=False)
        q, k, v = drafter.qkv(u, positions)
        keys.append(k)
        values.append(v)
        mask = ttt_mask(span, step, device).expand(b, -1, -1)
        h = drafter.attend_mlp(q, torch.cat(keys, 1), torch.cat(values, 1), resid, mask)
        live = label_ok & (p - step >= 0)
        sel = live.flatten()
        if bool(sel.any()):
            student = drafter.draft_logits(drafter.norm(h).reshape(b * span, -1)[sel], target)
            teacher = None
            if need_teacher:
                rows = torch.arange(b, device=device)[:, None].expand(b, span).flatten()[sel]
                teacher = teacher_logits(target, final, rows, (p + 1).expand(b, span).flatten()[sel])
            chosen = labels.flatten()[sel]
            weights = torch.ones(int(sel.sum()), device=device)
            d_labels, d_teacher, weights = to_draft_vocab(drafter.draft_vocab, target.cfg.vocab_size, chosen,
                                                          teacher, weights)
            loss, parts = distill_loss(student, d_labels, d_teacher, weights, loss_cfg)
            w = step_weight ** step
            total = total + w * loss
            norm += w
            with torch.no_grad():
                stats[f"top1_step{step}"] = float((drafter.to_target_ids(student.argmax(-1)) == chosen).float().mean())
            for name, value in parts.items():
                stats[f"{name}_step{step}"] = value
        h_prev = h
    loss = total / max(norm, 1e-8)
    stats["loss"] = float(loss.detach())
    return loss, stats
