"""Prefills beside decoding (`EngineConfig(async_prefill=True)`): new prompts prefill on a side CUDA stream
while the batch keeps stepping, and join it once their first tokens are read.

Why: on an H200 a batch-32 admission (about five prompts) replays some 2.8 ms of small kernels, about
1.5 decode steps, during which every decoding row waits; the decode step's kernels at that batch leave
most of the GPU's SMs idle, so the prefill's can run beside them. That stall is the same seconds for
every method and so a larger share of the faster one (at batch 32 on an H200 the steps alone gave
AdaFlash 2.05×, with prefills 1.93×). Measured, it did not pay for GSM8K's short prompts: the
prefills' time fell little and the passes beside them slowed, so it is off by default.

Why it is safe: an admission's slots are reserved until it joins. No decode pass writes them (while an
admission is out, passes pad with the scratch slot, never with free slots), and the prefill writes only
their rows of the shared buffers (KV caches, tokens, features). The side stream first waits for the
work already queued, and the main stream waits on the admission's event before a pass reads its rows.
Greedy admissions only (a sampled first token would share the engine's generator across streams); one
admission out at a time. On a CPU, or without padding, there is no stream: the admission runs as it
is launched and joins at the next step, which is what the CPU tests exercise.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import torch

from adaflash.engine.sampling import sample_for
from adaflash.engine.sequence import RunningSeq

# Padded prompt tokens one prefill pass takes at most (always at least one prompt). Why: a pass over
# every free slot at once (256 long prompts on a GPU) holds activations of [rows x width] and an
# attention score matrix of rows x width^2, gigabytes past what the cache was sized for.
PREFILL_TOKENS = 65536

if TYPE_CHECKING:
    from adaflash.engine.engine import StepEvent
    from adaflash.engine.passes import DevicePasses


@dataclass
class Admission:
    """Prompts prefilled (or being prefilled) whose rows have not joined the batch yet."""

    seqs: list[RunningSeq]
    first: torch.Tensor  # [b] each prompt's first token, on the device, in the order of `seqs`
    done: torch.cuda.Event | None  # recorded on the side stream after the prefill; None: done at launch
    stream: torch.cuda.Stream | None
    seconds: float  # host time spent launching it
    aborted: set[str] = field(default_factory=set)  # rids dropped before joining: their slots come free

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def firsts(self) -> list[int]:
        """The first tokens, read on the side stream (the main one may have a step queued), waiting if
        the prefill has not ended; the main stream then waits on the prefill before its next pass."""
        if self.stream is None:
            return self.first.tolist()
        assert self.done is not None
        self.done.synchronize()
        torch.cuda.current_stream().wait_event(self.done)
        with torch.cuda.stream(self.stream):
            return self.first.tolist()


class Admitting:
    """The Engine's admissions: when waiting prompts are taken into free slots, and their prefill, at once
    or beside decoding. A part of `Engine` (its state is the engine's), apart because when and how a
    prompt enters the batch is one idea and the step loop another."""

    waiting: deque
    active: dict[int, RunningSeq]
    passes: DevicePasses
    max_batch: int
    admit_batch: int
    async_prefill: bool
    _side: torch.cuda.Stream | None
    _admission: Admission | None

    def _admitting(self) -> bool:
        """Prefill now: an idle engine at once, a busy one once `admit_batch` slots are free.

        Waiting for free slots, not for queued prompts: a producer that tops the queue up to the
        free slots (the pipeline's inference worker) would otherwise be admitted one by one.
        """
        if not self.waiting or self._admission is not None:  # one admission out at a time
            return False
        return not self.active or self.max_batch - len(self.active) >= self.admit_batch

    def _free_slots(self) -> list[int]:
        return [i for i in range(self.max_batch) if i not in self.active]

    def _admitted(self) -> list[RunningSeq]:
        """Waiting prompts taken into the free slots, in slot order, while the padded prefill stays
        within `PREFILL_TOKENS` (the rest wait for the next admission)."""
        admitted: list[RunningSeq] = []
        widest = 0
        for slot in self._free_slots():
            if not self.waiting:
                break
            width = max(widest, len(self.waiting[0][0].prompt_ids))
            if admitted and width * (len(admitted) + 1) > PREFILL_TOKENS:
                break
            widest = width
            request, arrived = self.waiting.popleft()
            admitted.append(RunningSeq(request, slot, arrived, clock=self.clock))
        return admitted

    @torch.no_grad()
    def _prefill(self) -> list[StepEvent]:
        """Admit and prefill now; the rows join the batch before the next step."""
        admitted = self._admitted()
        started = time.perf_counter()
        firsts = self._launch_prefill(admitted).tolist()
        elapsed = time.perf_counter() - started
        self._count("prefill", elapsed)
        return self._activate(admitted, firsts, elapsed)

    def _launch_prefill(self, admitted: list[RunningSeq]) -> torch.Tensor:
        """The target's pass over the prompts and the drafter's context of them; their first tokens."""
        lens = [len(s.request.prompt_ids) for s in admitted]
        ids = torch.zeros(len(admitted), max(lens), dtype=torch.long, device=self.device)
        for i, seq in enumerate(admitted):
            ids[i, : lens[i]] = torch.tensor(seq.request.prompt_ids, device=self.device)
            seq.length = lens[i]
        rows = torch.tensor([s.slot for s in admitted], device=self.device)
        length = torch.tensor(lens, device=self.device)
        logits = self.passes.prefill(ids, rows, length)
        first = sample_for(logits, [s.request.params for s in admitted], self.generator, positions=[0] * len(admitted))
        self.passes.admit(rows, length, first, ids.shape[1])
        return first

    def _activate(self, admitted: list[RunningSeq], firsts: list[int], seconds: float) -> list[StepEvent]:
        events = []
        for seq, first in zip(admitted, firsts):
            self.active[seq.slot] = seq
            seq.verify_ct += 1
            seq.verify_time += seconds
            events.append(self._emit(seq, [first], accepted=0, proposed=0))
        return events

    def _beside(self) -> bool:
        """Prefill the next admission beside decoding: asked for, rows decoding, every prompt it takes greedy."""
        if not self.async_prefill or not self.active:
            return False
        free = self.max_batch - len(self.active)
        return all(request.params.temperature == 0 for request, _ in islice(self.waiting, free))

    @torch.no_grad()
    def _begin_admission(self) -> Admission:
        """Launch the next admission's prefill on the side stream (inline on a CPU); it joins later."""
        admitted = self._admitted()
        started = time.perf_counter()
        side, done = self._side, None
        if side is None:
            first = self._launch_prefill(admitted)
        else:
            side.wait_stream(torch.cuda.current_stream())  # after every pass already queued
            with torch.cuda.stream(side):
                first = self._launch_prefill(admitted)
                done = torch.cuda.Event()
                done.record(side)
        return Admission(admitted, first, done, side, time.perf_counter() - started)

    def _join(self, *, wait: bool) -> list[StepEvent]:
        """The admission out, if it is done (or `wait`): its rows join the batch, their first tokens go out."""
        admission = self._admission
        if admission is None or not (wait or admission.ready()):
            return []
        self._admission = None
        started = time.perf_counter()
        firsts = admission.firsts()
        seconds = admission.seconds + time.perf_counter() - started
        self._count("prefill", seconds)
        kept = [(seq, first) for seq, first in zip(admission.seqs, firsts) if seq.request.rid not in admission.aborted]
        return self._activate([seq for seq, _ in kept], [first for _, first in kept], seconds)
