"""Overlapped steps: a greedy step on the device and what the host reads back of it (`Overlapping`, a part of
`Engine`).

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
    from adaflash.engine.engine import StepEvent
    from adaflash.engine.length_policy import Plan
    from adaflash.engine.passes import DevicePasses, LengthChooser
    from adaflash.models.drafters import Drafter
    from adaflash.models.loading import Target


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


class Overlapping:
    """The Engine's overlapped steps: which rows step again, the launch, and the read. A part of `Engine` (its
    state is the engine's), apart because keeping the device busy across two steps is one idea and what a
    step does another."""

    active: dict[int, RunningSeq]
    overlap: bool
    passes: DevicePasses
    target: Target
    drafter: Drafter | None
    length_policy: str
    _flight: Flight | None
    _left: list[RunningSeq]
    _settled: list[StepEvent]

    def _decoding(self, landed: Landed | None) -> Rows:
        """The rows to step now, by slot; a row the landed step ends (stop token, length) is not.

        Where every decoding row was in the landed step (no prompt was admitted since), they come from its
        arrays (`Landed.next_rows`): the device waits for this, and it is the common case."""
        eos = self.target.eos_ids
        if landed is not None:
            moved, ends = landed.next_rows(eos)
            if len(moved) == len(self.active):  # the landed rows are live, so these are every active row
                return moved.pick(~ends)
            after = {seq.slot: i for i, seq in enumerate(moved.seqs)}
            landed.keep_levels()  # the rows below read their predictions from the rows themselves
        seqs = [s for _, s in sorted(self.active.items()) if s.verify_ct > 0 and s.finish is None]
        if landed is None:
            return Rows.of(seqs, eos)
        seqs = [s for s in seqs if s.slot not in after or not ends[after[s.slot]]]
        pending, lengths, produced = [], [], []
        for seq in seqs:  # a landed row as the step moved it on (its tokens not yet taken), a new one as it is
            i = after.get(seq.slot)
            pending.append(seq.pending if i is None else int(moved.pending[i]))
            lengths.append(seq.length if i is None else int(moved.lengths[i]))
            produced.append(len(seq.output_ids) if i is None else int(moved.produced[i]))
        return Rows.of(seqs, eos, pending, lengths, produced)

    def _overlappable(self, rows: Rows, chooser: LengthChooser | None) -> bool:
        """Greedy rows whose whole step runs on the device: no drafts or lengths the host must see (the
        cost rule's widths are chosen before the launch, from predictions earlier steps brought back)."""
        if not self.overlap or not rows.greedy:
            return False
        if chooser is not None and not self._sizes_ahead():
            return False
        return self.drafter is None or (self._draft_steps() or 0) <= self.drafter.max_draft

    @torch.no_grad()
    def _launch(self, rows: Rows, steps: int | None = None, predict: bool = False) -> Flight:
        """Launch a greedy step from each row's pending token and length (a landed step's where it moved the
        row on: the host has not taken its tokens yet). `steps`: drafts every row verifies (None:
        `_draft_steps`); `predict`: the step brings the head's predictions back."""
        slots, in_order, (rows_d, pending_d, lens) = self._step_rows(rows.slots, rows.pending, rows.lengths, fill=True)
        # On the engine's clock: a flight may be read in a later turn of a bench whose engines take turns.
        longest, started = int(rows.lengths.max()), self.clock()
        self._left = []  # rows that leave the batch from now on: the flight's `_land` drops them
        if self.drafter is None:
            drafts, verify_n = self.passes.draft(rows_d, pending_d, lens, longest, steps=None, choose=None)
            packed = self.passes.greedy_step(rows_d, pending_d, drafts, verify_n, lens, longest, in_order=in_order)
            kind = "decode"
        else:
            packed = self.passes.draft_and_step(rows_d, pending_d, lens, longest, steps=steps or self._draft_steps(),
                                                predict=predict, in_order=in_order)
            kind = "whole"
        plan = self._cost_rule().take_plan() if self._reads_head() and self.length_policy == "cost" else None
        at = None if len(slots) == len(rows) else np.searchsorted(np.asarray(slots), rows.slots)
        return Flight(rows, packed, at, kind, started, predicted=predict, plan=plan)

    def _land(self) -> Landed | None:
        """Read the step in flight (the host's one sync for it); `_account_landed` counts it."""
        flight, self._flight = self._flight, None
        if flight is None:
            return None
        packed = flight.packed.cpu().numpy()
        seconds = self.clock() - flight.started
        if flight.at is not None:
            packed = packed[flight.at]
        rows = flight.rows
        if self._left:  # rows aborted, or ended by a stop string, since the launch: theirs are dropped
            found = np.searchsorted(rows.slots, [seq.slot for seq in self._left]).tolist()
            gone = [i for i, seq in zip(found, self._left) if i < len(rows) and rows.seqs[i] is seq]
            if gone:
                live = np.ones(len(rows), dtype=bool)
                live[gone] = False
                rows, packed = rows.pick(live), packed[live]
        levels = None
        if flight.predicted:
            levels, packed = packed[:, -1], packed[:, :-1]
        return Landed(rows, packed, seconds, flight.kind, flight.plan, levels)

    def _account_landed(self, landed: Landed) -> None:
        landed.keep_levels()
        if landed.seqs:
            self._account(landed.seqs, landed.rows, landed.kind, landed.seconds, plan=landed.plan)

    def _live(self, seq: RunningSeq) -> bool:
        """Still decoding in its slot: not ended by a stop string, not aborted (its slot maybe refilled)."""
        return seq.finish is None and self.active.get(seq.slot) is seq

    def _take_landed(self, landed: Landed) -> list[StepEvent]:
        return self._take(landed.seqs, landed.rows, draft_s=0.0, verify_s=landed.seconds)

    def _settle(self) -> None:
        """Read and take the step in flight now (its events go out with the next `step`): before
        anything that must see every row's tokens, such as a drafter swap."""
        landed = self._land()
        if landed is not None:
            self._account_landed(landed)
            self._settled += self._take_landed(landed)
