"""Target features for training: the hidden states a drafter reads, and teacher logits where asked."""

from __future__ import annotations

import torch

from adaflash.models.target import TargetModel


@torch.no_grad()
def target_features(target: TargetModel, ids: torch.Tensor, layer_ids: list[int],
                    with_last: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated features [b, S, n·H] of `layer_ids`, and optionally the last layer's output [b, S, H]."""
    b, width = ids.shape
    capture = list(layer_ids)
    last = target.cfg.num_hidden_layers - 1
    if with_last and last not in capture:
        capture.append(last)
    cache = target.new_cache(b, width)
    positions = torch.arange(width, device=ids.device).expand(b, width)
    _, captured = target(ids, positions, cache, torch.arange(b, device=ids.device), capture=capture,
                         logits_index=torch.zeros(b, dtype=torch.long, device=ids.device))
    feats = torch.cat(captured[: len(layer_ids)], dim=-1)
    final = captured[capture.index(last)] if with_last else None
    return feats, final


@torch.no_grad()
def teacher_logits(target: TargetModel, final_hidden: torch.Tensor, rows: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    """The target's logits at (rows, positions): its prediction for the token after each position."""
    return target.logits(final_hidden[rows, positions])
