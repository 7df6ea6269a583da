"""A greedy step on the device and what the host reads back of it: the two halves of an overlapped step.

`Engine.step` launches a step whose whole work runs on the device (no drafts or widths the host must see)
and reads it in its next call; the step after it is launched from what was read, before the host takes
the tokens, so the device runs while the host handles stops, events and its caller's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from adaflash.engine.sequence import RunningSeq

if TYPE_CHECKING:
    from adaflash.engine.length_policy import Plan


@dataclass
class Flight:
    """A greedy step launched on the device whose tokens the host has not read (`Engine.step`)."""

    seqs: list[RunningSeq]
    slots: list[int]  # the pass's rows, free slots that pad it included
    packed: torch.Tensor  # per slot: accepted, verified, then the emitted tokens
    kind: str
    started: float  # on the engine's clock
    predicted: bool = False  # `packed` ends with the length head's prediction column (`DevicePasses.draft_and_step`)
    plan: Plan | None = None  # what the cost rule planned for this step (`CostRule.take_plan`), for its `record`


@dataclass
class Landed:
    """A flight's rows read back, for the rows still decoding: what the next launch needs first."""

    seqs: list[RunningSeq]
    rows: list[list[int]]
    seconds: float
    kind: str  # the flight's
    plan: Plan | None  # the flight's, for the cost rule's `record`

    @cached_property
    def tokens(self) -> dict[int, list[int]]:
        """Per slot, the tokens the step emitted."""
        return {s.slot: r[2: r[0] + 3] for s, r in zip(self.seqs, self.rows)}

    @cached_property
    def after(self) -> dict[int, tuple[int, int]]:
        """Per slot, the pending token and cache length once the step's tokens are taken."""
        return {s.slot: (r[r[0] + 2], s.length + r[0] + 1) for s, r in zip(self.seqs, self.rows)}
