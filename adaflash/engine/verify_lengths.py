"""How many drafts a step verifies: a fixed length, the drafter's whole block, or the AdaFlash length
head's choice by the rate or the cost rule (`length_policy`). A part of `Engine` (its state is the
engine's), apart because choosing a width is one idea and scheduling the step another."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from adaflash.engine.length_policy import CostRule
from adaflash.engine.passes import PREDICTION_SCALE, LengthChooser
from adaflash.methods import method_of

if TYPE_CHECKING:
    from adaflash.engine.config import EngineConfig
    from adaflash.engine.flight import Rows
    from adaflash.models.drafters import Drafter


class VerifyLengths:
    """The engine's verify-width choice; `Engine.__init__` calls `_init_verify_lengths`."""

    drafter: Drafter | None
    max_batch: int
    overlap: bool

    def _init_verify_lengths(self, method: str, cfg: EngineConfig) -> None:
        self.length_rate = cfg.length_rate
        self.min_length = cfg.min_length
        self.length_policy = cfg.length_policy
        self.cost_rule: CostRule | None = None  # made for the drafter's block on first use
        self._mode_ahead: tuple[int, bool] | None = None  # (batch bucket, whole blocks) for the coming step
        self.num_steps = cfg.num_steps
        self.use_length_head = method_of(method).length_head if cfg.use_length_head is None else cfg.use_length_head
        self.verify_length = cfg.verify_length  # a fixed block length to verify (baseline for the head)

    def _draft_steps(self) -> int | None:
        """Drafts per pass: a fixed verify length pins it, else num_steps (None: the drafter's own)."""
        if self.verify_length is not None and self.drafter is not None:
            return min(max(self.verify_length - 1, 1), self.drafter.max_draft)
        return self.num_steps

    def _reads_head(self) -> bool:
        """The length head decides verify lengths unless it is off or a fixed length is asked for."""
        return self.use_length_head and self.verify_length is None

    def _length_chooser(self, batch: int) -> LengthChooser | None:
        """How this step's verify lengths are chosen; None: every row verifies the whole block. That is
        the case where the cost rule finds whole blocks pay at least as well as the head's choice, and
        then the drafter need not run its head at all."""
        if not self._reads_head():
            return None
        if self.length_policy == "cost" and self._whole_blocks(batch):
            return None
        return self._choose_lengths

    def _whole_blocks(self, batch: int) -> bool:
        """The cost rule's mode for the coming step: decided after the last launch (`_decide_ahead`) while its
        batch bucket holds, else now."""
        rule = self._cost_rule()
        ahead, self._mode_ahead = self._mode_ahead, None
        if ahead is not None and ahead[0] == rule.bucket(batch):
            return ahead[1]
        return rule.whole_blocks(batch)

    def _decide_ahead(self, batch: int) -> None:
        """After an overlapped launch, while the device runs: the rule's mode for the step after it, for a
        batch of this size. Why: weighing the modes reads the rule's tables (tens of µs of Python a step on a
        CPU), and between a step's read and the next launch the device would wait for it."""
        if self._sizes_ahead():
            rule = self._cost_rule()
            self._mode_ahead = (rule.bucket(batch), rule.whole_blocks(batch))

    def _sizes_ahead(self) -> bool:
        """The cost rule sizes an overlapped step before its launch, from the predictions the steps before
        brought back with their tokens. Why: a width read from the step's own prediction makes the host
        wait for the draft before it can launch the verify, and that step cannot overlap the host's work
        (at 8B, batch 32, on an H100, such a step verifying 8 cost 15.1 ms against 13.2 for an
        overlapped whole block). The width is one for the batch, so a prediction one step old steers it
        nearly as well: a row's acceptance moves slowly from step to step."""
        return self._reads_head() and self.length_policy == "cost" and self.overlap \
            and self.drafter is not None and self.drafter.predicts_length

    def _ahead_plan(self, rows: Rows, chooser: LengthChooser | None) -> tuple[int | None, bool]:
        """For an overlapped step: (drafts every row verifies, None for `_draft_steps`; whether the step
        brings the head's predictions back)."""
        if not self._sizes_ahead():
            return None, False
        assert self.drafter is not None  # `_sizes_ahead` says so
        rule = self._cost_rule()
        if chooser is None:
            return None, rule.head_wanted
        levels = rows.levels if rows.levels is not None else np.full(len(rows), np.nan)
        unknown = np.isnan(levels)
        if unknown.any():  # rows new to the batch count as its mean, or as whole blocks accepted when none has one
            levels = np.where(unknown, levels[~unknown].mean() if not unknown.all() else PREDICTION_SCALE, levels)
        drafts = rule.drafts(levels / PREDICTION_SCALE, self.drafter.max_draft)
        return (self.drafter.max_draft if drafts is None else max(1, drafts)), True

    def _cost_rule(self) -> CostRule:
        block = self.drafter.block_size if self.drafter is not None else 1
        if self.cost_rule is None or self.cost_rule.block != block:
            self.cost_rule = CostRule(block, self.min_length, max_batch=self.max_batch)
            self._mode_ahead = None  # the old rule's
        return self.cost_rule

    def _choose_lengths(self, length_pred: torch.Tensor, k: int) -> torch.Tensor | None:
        """The length head's ratio → drafted tokens to verify per row (at least min_length - 1), by the
        design's rate rule or by measured step cost (`length_policy`, see engine/length_policy.py)."""
        if self.length_policy == "cost":
            return self._cost_rule().choose(length_pred, k)
        block = self.drafter.block_size if self.drafter is not None else k + 1
        want = torch.round(length_pred.float() * block * self.length_rate).long()
        return (want.clamp(min=self.min_length, max=block) - 1).clamp(max=k)
