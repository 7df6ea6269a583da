"""When waiting prompts enter the batch, and their prefill.

Why grouped: on a GPU a prefill costs about the same for one prompt as for a dozen, so a busy engine
waits for `admit_batch` free slots. Prefilling beside decoding on a side CUDA stream was tried
and ran slower than prefilling in line, so admissions run in the step loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from adaflash.engine.sampling import sample_for
from adaflash.engine.sequence import RunningSeq

# Padded prompt tokens one prefill pass takes at most (always at least one prompt). Why: a pass over
# every free slot at once (256 long prompts on a GPU) holds activations of [rows x width] and an
# attention score matrix of rows x width^2, gigabytes past what the cache was sized for.
PREFILL_TOKENS = 65536
# What one more prefill pass costs, in padded prompt positions: the fixed work of a pass (its launches or
# replay, the drafter's extend) against the padding that splitting an admission by length saves. On an
# H200 a replayed prefill of 8 x 256 positions took 3.4 ms where passes of 16,384-65,536 took 0.32 ms a
# thousand positions: about 8,000 positions of SmolLM2's; an 8B target's positions cost far more each.
PASS_POSITIONS = 4096


if TYPE_CHECKING:
    from adaflash.engine.engine import StepEvent
    from adaflash.engine.passes import DevicePasses
    from adaflash.engine.scripted import ScriptedAcceptance


def prefill_groups(lengths: list[int], positions: Callable[[int, int], int]) -> list[list[int]]:
    """The admitted prompts (indices into `lengths`) split into prefill passes by length: each pass pads
    to its own longest, so a few long prompts no longer make every short one pay their width. Sorted by
    length, cut only where the padded width's bucket changes (powers of two), the cuts chosen to minimize
    the passes' padded positions (`positions(rows, longest)`) plus `PASS_POSITIONS` for each pass.

    Why: GSM8K questions in the chat template run 54-177 tokens (mean 92); a group of 32 padded to its
    longest computes about 2.6 times its real tokens, and prefills take a third or more of a large batch's
    time. Splitting changes no bits: a prompt's prefill is the same whatever is padded beside it."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cuts = [0] + [i for i in range(1, len(order))
                  if _width_bucket(lengths[order[i]]) != _width_bucket(lengths[order[i - 1]])] + [len(order)]
    # best[j]: the cheapest passes over order[:cuts[j]], and where its last pass starts
    best: list[tuple[float, int]] = [(0.0, 0)]
    for j in range(1, len(cuts)):
        best.append(min((best[i][0] + positions(cuts[j] - cuts[i], lengths[order[cuts[j] - 1]]) + PASS_POSITIONS, i)
                        for i in range(j)))
    groups, j = [], len(cuts) - 1
    while j > 0:
        i = best[j][1]
        groups.append(order[cuts[i]:cuts[j]])
        j = i
    return groups[::-1]


def _width_bucket(length: int) -> int:
    return 1 << max(length - 1, 0).bit_length()


class Admitting:
    """The Engine's admissions: when waiting prompts are taken into free slots, and their prefill. A part
    of `Engine` (its state is the engine's), apart because when and how a prompt enters the batch is one
    idea and the step loop another."""

    waiting: deque
    active: dict[int, RunningSeq]
    passes: DevicePasses
    max_batch: int
    admit_batch: int
    script: ScriptedAcceptance | None

    def _admitting(self) -> bool:
        """Prefill now: an idle engine at once, a busy one once `admit_batch` slots are free.

        Waiting for free slots, not for queued prompts: a producer that tops the queue up to the
        free slots (the pipeline's inference worker) would otherwise be admitted one by one.
        """
        if not self.waiting:
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
        self._count("prefill", elapsed, len(admitted))
        return self._activate(admitted, firsts, elapsed)

    def _launch_prefill(self, admitted: list[RunningSeq]) -> torch.Tensor:
        """The target's pass over the prompts and the drafter's context of them; their first tokens.

        On exact shapes (a CPU) each prompt runs alone at its own length: prefilled beside others, padded to
        the longest, its keys and values took other bits, and greedy answers changed with the prompts that
        happened to arrive with them. There a prefill's cost is its tokens anyway. Padded passes (a GPU) run
        batch-invariant kernels and take the prompts together, in passes by length (`prefill_groups`)."""
        if not self.passes.padded:
            return torch.cat([self._prefill_pass([seq]) for seq in admitted])
        groups = prefill_groups([len(s.request.prompt_ids) for s in admitted], self.passes.prefill_positions)
        if len(groups) == 1:
            return self._prefill_pass(admitted)
        firsts = torch.cat([self._prefill_pass([admitted[i] for i in group]) for group in groups])
        in_order = torch.empty_like(firsts)
        in_order[torch.tensor([i for group in groups for i in group], device=firsts.device)] = firsts
        return in_order

    def _prefill_pass(self, admitted: list[RunningSeq]) -> torch.Tensor:
        lens = [len(s.request.prompt_ids) for s in admitted]
        # the prompts padded on the host, then one copy to the device (a copy a prompt cost milliseconds a
        # prefill at batch 256), with each row's slot and length as two more columns
        host = np.zeros((len(admitted), max(lens) + 2), dtype=np.int64)
        for i, seq in enumerate(admitted):
            host[i, : lens[i]] = seq.request.prompt_ids
            seq.length = lens[i]
            if self.script is not None:
                self.script.admit(seq.slot, seq.request.prompt_ids)
        host[:, -2] = [s.slot for s in admitted]
        host[:, -1] = lens
        on_device = torch.from_numpy(host).to(self.device)
        ids, rows, length = on_device[:, :-2], on_device[:, -2], on_device[:, -1]
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
