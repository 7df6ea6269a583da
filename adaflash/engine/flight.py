"""A greedy step on the device and what the host reads back of it: the two halves of an overlapped step.

`Engine.step` launches a step whose whole work runs on the device (no drafts or widths the host must see)
and reads it in its next call; the step after it is launched from what was read, before the host takes
the tokens, so the device runs while the host handles stops, events and its caller's work.

Between that read and the next launch the device waits, so the rows that step again, and their pending
tokens and lengths, are found with array operations over the batch (`Rows`, `Landed.next_rows`): as
Python loops over rows they took about 0.4 ms a step at batch 512 on a CPU, a tenth of a step's time on
a GPU, growing with the batch. What the host does with the tokens after the launch stays per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from adaflash.engine.sequence import RunningSeq

if TYPE_CHECKING:
    from adaflash.engine.length_policy import Plan


NO_STOPS, EOS, OWN_STOPS = 0, 1, 2  # what stops a row (`Rows.stops`)


def _stops(stop_ids: frozenset[int], eos: frozenset[int]) -> int:
    return NO_STOPS if not stop_ids else EOS if stop_ids == eos else OWN_STOPS


@dataclass
class Rows:
    """Rows about to step (ascending slots), as arrays: each one's pending token and cache length, the
    tokens it has emitted so far and may emit at most, and which tokens stop it (`stops`: NO_STOPS, EOS,
    the target's eos ids, or OWN_STOPS, others, checked row by row)."""

    seqs: list[RunningSeq]
    slots: np.ndarray
    pending: np.ndarray
    lengths: np.ndarray
    produced: np.ndarray
    limits: np.ndarray
    stops: np.ndarray
    greedy: bool  # every row decodes greedily (it may then step overlapped)
    levels: np.ndarray | None = None  # the length head's latest prediction per row, NaN where none came yet

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def of(cls, seqs: list[RunningSeq], eos_ids: Sequence[int], pending: list[int] | None = None,
           lengths: list[int] | None = None, produced: list[int] | None = None) -> Rows:
        """From the rows' own state (or the given columns, where a landed step has moved them on)."""
        eos = frozenset(eos_ids)
        params = [s.request.params for s in seqs]
        return cls(seqs, np.array([s.slot for s in seqs], dtype=np.int64),
                   np.array(pending if pending is not None else [s.pending for s in seqs], dtype=np.int64),
                   np.array(lengths if lengths is not None else [s.length for s in seqs], dtype=np.int64),
                   np.array(produced if produced is not None else [len(s.output_ids) for s in seqs], dtype=np.int64),
                   np.array([p.max_new_tokens for p in params], dtype=np.int64),
                   np.array([_stops(s.stop_ids(eos_ids), eos) for s in seqs], dtype=np.int8),
                   all(p.temperature == 0 for p in params),
                   np.array([np.nan if s.predicted is None else s.predicted for s in seqs], dtype=np.float64))

    def pick(self, keep: np.ndarray) -> Rows:
        """The rows where `keep` is true."""
        seqs = self.seqs if keep.all() else [s for s, k in zip(self.seqs, keep.tolist()) if k]
        return Rows(seqs, self.slots[keep], self.pending[keep], self.lengths[keep], self.produced[keep],
                    self.limits[keep], self.stops[keep], self.greedy, None if self.levels is None else self.levels[keep])


@dataclass
class Flight:
    """A greedy step launched on the device whose tokens the host has not read (`Engine.step`)."""

    rows: Rows
    packed: torch.Tensor  # per row of the pass: accepted, verified, then the emitted tokens
    at: np.ndarray | None  # each of `rows`' row in `packed`, where free slots pad the pass; None: the same order
    kind: str
    started: float  # on the engine's clock
    predicted: bool = False  # `packed` ends with the length head's prediction column (`DevicePasses.draft_and_step`)
    plan: Plan | None = None  # what the cost rule planned for this step (`CostRule.take_plan`), for its `record`

    @property
    def seqs(self) -> list[RunningSeq]:
        return self.rows.seqs


@dataclass
class Landed:
    """A flight's rows read back, for the rows still decoding: what the next launch needs first."""

    before: Rows  # the live rows as the step was launched
    packed: np.ndarray  # their rows of the step: accepted, verified, then the emitted tokens
    seconds: float
    kind: str  # the flight's
    plan: Plan | None  # the flight's, for the cost rule's `record`
    levels: np.ndarray | None = None  # the length head's predictions the step brought back, per row

    @property
    def seqs(self) -> list[RunningSeq]:
        return self.before.seqs

    def keep_levels(self) -> None:
        """Each row keeps the prediction the step brought back (`RunningSeq.predicted`): after the next launch,
        which reads them from `next_rows`."""
        if self.levels is not None:
            for seq, level in zip(self.seqs, self.levels.tolist()):
                seq.predicted = int(level)

    @cached_property
    def rows(self) -> list[list[int]]:
        """Per row, as lists: for the per-row work after the next launch."""
        return self.packed.tolist()

    def next_rows(self, eos_ids: Sequence[int]) -> tuple[Rows, np.ndarray]:
        """(every landed row moved on by the step: its pending token and length once it takes the step's
        tokens, the tokens it will have emitted; whether the step ends it, by a stop token or its length:
        such a row steps no more)."""
        rows, packed = self.before, self.packed
        accepted = packed[:, 0]
        count = accepted + 1
        produced = rows.produced + count
        ends = produced >= rows.limits
        emitted = packed[:, 2:]
        taken = np.arange(emitted.shape[1]) < count[:, None]
        at_eos = rows.stops == EOS
        if at_eos.any():
            ends |= at_eos & (np.isin(emitted, np.asarray(eos_ids, dtype=np.int64)) & taken).any(axis=1)
        for i in np.flatnonzero(rows.stops == OWN_STOPS).tolist():
            ends[i] |= not rows.seqs[i].stop_ids(eos_ids).isdisjoint(emitted[i, : count[i]].tolist())
        levels = rows.levels if self.levels is None else self.levels.astype(np.float64)
        moved = Rows(rows.seqs, rows.slots, emitted[np.arange(len(count)), accepted], rows.lengths + count,
                     produced, rows.limits, rows.stops, rows.greedy, levels)
        return moved, ends
