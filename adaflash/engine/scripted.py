"""Drafts whose acceptance follows given shares by position: a benchmark mode for targets whose drafter
means nothing.

Why: a synthetic target (random weights, `models synth`) runs at the real speed of its architecture, but
no drafter can guess it, so τ stays near 1 and the length head has nothing to choose. Here the drafter
still runs every pass (its cost is real) and `DevicePasses` then replaces its tokens on the device, inside
the same CUDA graphs: position i carries the target's own greedy token (from a Vanilla run of the same
prompts) with probability a_i and a wrong one otherwise, so a step accepts as a drafter with that
acceptance by position would. The length head reads a constant, the expected share of the block a step
accepts: a head that cannot tell steps apart, so AdaFlash's cost rule picks widths from the timings
alone. Verification stays the target's: every output is still Vanilla's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adaflash.models.drafters import Drafter


def expected_tokens(shares: Sequence[float], drafts: int) -> float:
    """Tokens a step yields on average when it verifies the first `drafts` drafted positions, position i
    accepted with share a_i of the steps that reach it: 1 + a1 + a1·a2 + ..."""
    total, reach = 1.0, 1.0
    for share in shares[:drafts]:
        reach *= share
        total += reach
    return total


class ScriptedAcceptance:
    """The script (each slot's reference tokens) and the shares; `DevicePasses` applies it to every draft."""

    def __init__(self, shares: Sequence[float], references: dict[tuple[int, ...], list[int]], *, slots: int,
                 width: int, vocab: int, device: torch.device) -> None:
        if not shares or any(not 0 <= s <= 1 for s in shares):
            raise ValueError(f"acceptance shares must lie in [0, 1], got {list(shares)}")
        self.shares = list(shares)
        self.references = references
        self.vocab = vocab
        self.script = torch.zeros(slots, width, dtype=torch.long, device=device)
        self._shares = torch.tensor(self.shares, device=device)
        self.block = len(self.shares) + 1  # the drafter's, once `check` has seen it

    def admit(self, slot: int, prompt_ids: Sequence[int]) -> None:
        """Write the reference answer of the prompt entering `slot` (a prompt without one drafts zeros)."""
        reference = self.references.get(tuple(prompt_ids), list(prompt_ids))[: self.script.shape[1]]
        self.script[slot].zero_()
        self.script[slot, : len(reference)] = torch.tensor(reference, device=self.script.device)

    def check(self, drafter: Drafter) -> None:
        """The drafter this script can drive: a block drafter drafting at most one token per share."""
        if drafter.kind != "block":
            raise ValueError(f"scripted acceptance drives block drafters (DFlash, AdaFlash); this one is {drafter.kind}")
        if len(self.shares) < drafter.max_draft:
            raise ValueError(f"--acceptance gives {len(self.shares)} shares; the drafter drafts {drafter.max_draft} "
                             "tokens a step: give one per drafted position")
        self.block = drafter.block_size

    def apply(self, drafts: torch.Tensor, predicted: torch.Tensor | None, rows: torch.Tensor,
              lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's output replaced on the device (graph-safe): the reference token at each position
        with its share's chance, else a wrong one; a constant prediction for the length head."""
        count = drafts.shape[1]
        where = (lens[:, None] + 1 + torch.arange(count, device=lens.device)).clamp(max=self.script.shape[1] - 1)
        truth = self.script[rows].gather(1, where)
        # one draw a position: a step accepts up to its first miss, as a drafter with these shares would
        hit = torch.rand(drafts.shape, device=drafts.device) < self._shares[:count]
        drafts = torch.where(hit, truth, (truth + 1) % self.vocab).to(drafts.dtype)
        if predicted is not None:
            predicted = torch.full_like(predicted, expected_tokens(self.shares, self.block - 1) / self.block)
        return drafts, predicted
