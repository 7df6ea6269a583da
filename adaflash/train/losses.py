"""Distillation losses shared by the offline trainers and the on-policy pipeline.

All take student logits [N, V], per-position weights [N] (position decay × validity) and return
(loss, stats) where stats are floats ready for the run log (including the clip ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSSES = ("ce", "rkl-mix", "fkl")


@dataclass
class LossConfig:
    """Parameters of every loss; recipes and CLI flags map onto these names."""

    kind: str = "ce"
    alpha: float = 0.8  # rkl-mix: weight of CE(argmax teacher)
    temperature: float = 1.0
    clip: float = 0.01  # rkl-mix: per-position cap on T²·KL / N
    gamma: float = 7.0  # DFlash position decay
    # DFlash: learn a block position only while the answer follows the target's greedy choice, and
    # against that choice (answers sampled at T > 0 then teach what greedy verification accepts)
    greedy_chain: bool = False

    def __post_init__(self) -> None:
        if self.kind not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.kind!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"loss alpha must be in [0, 1], got {self.alpha}")
        if self.temperature <= 0 or self.clip <= 0 or self.gamma <= 0:
            raise ValueError("loss temperature, clip and gamma must be positive")


def position_decay(block_size: int, gamma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """w_k = exp(-(k-1)/γ) for block positions k = 0..B-1 (k = 0, the anchor, gets 0)."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


def _weighted(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / weights.sum().clamp_min(1e-8)


def ce_loss(student: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    ce = F.cross_entropy(student.float(), labels, reduction="none")
    loss = _weighted(ce, weights)
    return loss, {"loss_ce": float(loss.detach())}


def reverse_kl_mix(student: torch.Tensor, teacher: torch.Tensor, weights: torch.Tensor,
                   cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """α·CE(q_S, argmax p_T) + (1-α)·Σ min(T²·KL(q_S‖p_T)/N, τ_clip)."""
    t = cfg.temperature
    ce = F.cross_entropy(student.float(), teacher.argmax(-1), reduction="none")
    log_q = F.log_softmax(student.float() / t, dim=-1)
    log_p = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1) * t * t
    live = weights > 0
    n = max(int(live.sum()), 1)
    per = kl / n
    clipped = torch.minimum(per, torch.full_like(per, cfg.clip))
    rkl = (clipped * weights).sum() / weights[live].mean().clamp_min(1e-8) if bool(live.any()) else clipped.sum() * 0
    ce_term = _weighted(ce, weights)
    loss = cfg.alpha * ce_term + (1 - cfg.alpha) * rkl
    ratio = float(((per > cfg.clip) & live).sum()) / n
    return loss, {"loss_ce": float(ce_term.detach()), "loss_rkl": float(rkl.detach()),
                  "kl_mean": float(_weighted(kl, weights).detach()), "clip_ratio": ratio}


def forward_kl(student: torch.Tensor, teacher: torch.Tensor, weights: torch.Tensor,
               cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """OSD's plain forward KL(p_T‖q_S) at temperature T."""
    t = cfg.temperature
    log_q = F.log_softmax(student.float() / t, dim=-1)
    log_p = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1) * t * t
    loss = _weighted(kl, weights)
    return loss, {"loss_fkl": float(loss.detach()), "clip_ratio": 0.0}


def to_draft_vocab(vocab: torch.Tensor | None, vocab_size: int, labels: torch.Tensor, teacher: torch.Tensor | None,
                   weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Labels and teacher logits in the drafter's vocabulary (identity without a draft vocabulary).

    A label outside the draft vocabulary cannot be drafted: it becomes -100 and its CE weight 0;
    the teacher keeps the draft vocabulary's columns, renormalized by the softmax of each loss.
    """
    if vocab is None:
        return labels, teacher, weights
    lookup = torch.full((vocab_size,), -100, dtype=torch.long, device=labels.device)
    lookup[vocab] = torch.arange(vocab.numel(), device=labels.device)
    mapped = lookup[labels]
    if teacher is None:
        weights = weights * (mapped >= 0)
    return mapped, (teacher[:, vocab] if teacher is not None else None), weights


def distill_loss(student: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor | None, weights: torch.Tensor,
                 cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.kind == "ce" or teacher is None:
        if cfg.kind != "ce":
            raise ValueError(f"loss {cfg.kind!r} needs teacher logits")
        return ce_loss(student, labels, weights)
    if cfg.kind == "rkl-mix":
        return reverse_kl_mix(student, teacher, weights, cfg)
    return forward_kl(student, teacher, weights, cfg)
