"""Offline initialization of the AdaFlash length head on a frozen drafter.

Labels come from teacher-forced acceptance on target-generated responses: for greedy
responses, the accepted length of a block anchored at `a` under the engine's verification is
exactly the number of leading drafted tokens equal to the response's tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adaflash.models.drafters import DFlashDrafter
from adaflash.models.length_head import LengthHead
from adaflash.models.loading import Target
from adaflash.train.data import Sequence, epoch_batches, pad
from adaflash.train.dflash import dflash_loss
from adaflash.train.evaluate import eval_tau
from adaflash.train.losses import LossConfig


def fit_length_head(drafter: DFlashDrafter, target: Target, sequences: list[Sequence], *, steps: int,
                    batch_tokens: int = 4096, blocks_per_seq: int = 16, lr: float = 1e-3, seed: int = 0,
                    on_step: Callable[[int, int, dict[str, float]], None] = lambda *_: None) -> dict[str, float]:
    if drafter.length_head is None:
        drafter.length_head = LengthHead(drafter.cfg.hidden_size)
    drafter.to(target.device).float()
    for p in drafter.parameters():
        p.requires_grad_(False)
    for p in drafter.length_head.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(drafter.length_head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    step, epoch, stats = 0, 0, {}
    while step < steps:
        for group in epoch_batches(sequences, batch_tokens, seed, epoch):
            ids, lens, starts = pad([sequences[i] for i in group], target.device)
            opt.zero_grad(set_to_none=True)
            loss, stats = dflash_loss(drafter, target.model, ids, lens, starts, blocks_per_seq=blocks_per_seq,
                                      loss_cfg=LossConfig("ce"), gen=gen, train_head=True)
            if "loss_length_head" not in stats:
                continue
            loss.backward()
            opt.step()
            step += 1
            on_step(step, steps, stats)
            if step >= steps:
                break
        epoch += 1
    for p in drafter.parameters():
        p.requires_grad_(True)
    return stats


def compare_lengths(target: Target, drafter: DFlashDrafter, prompts: list[str], *, max_new_tokens: int = 64,
                    fixed: tuple[int, ...] = (4, 8)) -> list[dict[str, float | str]]:
    """τ and tokens/s of the head against fixed verified lengths, all through the engine."""
    rows: list[dict[str, float | str]] = []
    for length in (*fixed, drafter.block_size):
        result = eval_tau(target, drafter, prompts, method="dflash", max_new_tokens=max_new_tokens,
                          verify_length=length)
        rows.append({"policy": f"fixed {length}", **result})
    result = eval_tau(target, drafter, prompts, method="adaflash", max_new_tokens=max_new_tokens)
    rows.append({"policy": "length head", **result})
    return rows
