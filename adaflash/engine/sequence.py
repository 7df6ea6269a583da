"""One request while it decodes: the tokens it takes, where it stops, and its Output's meta.

Apart from the engine because none of it touches a slot or the device: what a sequence does with
the tokens a step hands it (count what was accepted, stop at a stop token, a stop string or
max_new_tokens) depends only on its request and the target's tokenizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adaflash.engine.detokenize import TextSoFar
from adaflash.engine.params import Output, Request

Decode = Callable[[list[int]], str]


@dataclass
class RunningSeq:
    request: Request
    slot: int
    arrived: float
    length: int = 0  # positions in the target's KV cache, mirrored on the host: no device reads
    output_ids: list[int] = field(default_factory=list)
    pending: int = -1
    verify_ct: int = 0
    proposed: int = 0
    correct: int = 0
    histogram: list[int] = field(default_factory=list)
    # per drafted position i (from 1): [steps that verified it with every draft before it accepted, of
    # those the steps that accepted it]; a length head's short verifies count only where they reached
    by_position: list[list[int]] = field(default_factory=list)
    predicted: int | None = None  # the length head's last prediction for this row, as a step's tokens brought it (× PREDICTION_SCALE)
    draft_time: float = 0.0
    verify_time: float = 0.0
    first_token_at: float | None = None
    finish: dict[str, Any] | None = None
    text: str = ""  # the answer cut before a matched stop string
    clock: Callable[[], float] = time.perf_counter  # the engine's (see Engine's `clock`)
    _so_far: TextSoFar | None = field(default=None, init=False, repr=False)  # stop strings' text, decoded in windows
    _stop_ids: frozenset[int] | None = field(default=None, init=False, repr=False)  # the request's stop tokens with the target's eos, once known

    def stop_ids(self, eos_ids: Sequence[int]) -> frozenset[int]:
        if self._stop_ids is None:
            params = self.request.params
            self._stop_ids = frozenset(params.stop_token_ids) | frozenset(() if params.ignore_eos else eos_ids)
        return self._stop_ids

    def take(self, new_ids: list[int], *, accepted: int, proposed: int, eos_ids: Sequence[int],
             decode: Decode) -> list[int]:
        """Append a step's tokens up to the first stop; returns the ones taken. `proposed` drafts of
        which `accepted` were accepted (0 and 0 for a prefill's first token)."""
        if self.first_token_at is None:
            self.first_token_at = self.clock()
        if proposed:
            self.proposed += proposed
            self.correct += accepted
            while len(self.histogram) <= accepted:
                self.histogram.append(0)
            self.histogram[accepted] += 1
            while len(self.by_position) < proposed:
                self.by_position.append([0, 0])
            for position in range(min(proposed, accepted + 1)):
                self.by_position[position][0] += 1
                self.by_position[position][1] += position < accepted
        params = self.request.params
        stop_ids = self.stop_ids(eos_ids)
        taken: list[int] = []
        for token in new_ids:
            taken.append(token)
            self.output_ids.append(token)
            if token in stop_ids:
                self.finish = {"type": "stop", "matched": token}
                break
            if params.stop and self._stopped_by_string(decode):
                break
            if len(self.output_ids) >= params.max_new_tokens:
                self.finish = {"type": "length", "length": params.max_new_tokens}
                break
        self.pending = new_ids[-1]
        return taken

    def _stopped_by_string(self, decode: Decode) -> bool:
        if self._so_far is None:
            self._so_far = TextSoFar(decode)
        text = self._so_far.update(self.output_ids)
        for stop in self.request.params.stop:
            at = text.find(stop)
            if at >= 0:
                self.finish = {"type": "stop", "matched": stop}
                self.text = text[:at]
                return True
        return False

    def output(self, decode: Decode, *, method: str, drafter_version: int | None) -> Output:
        """The finished request, with SGLang's meta_info fields (and ours: times, method, version)."""
        now = self.clock()
        text = self.text if self.finish and isinstance(self.finish.get("matched"), str) else decode(self.output_ids)
        completion = len(self.output_ids)
        meta = {
            "id": self.request.rid,
            "prompt_tokens": len(self.request.prompt_ids),
            "completion_tokens": completion,
            "finish_reason": self.finish,
            "e2e_latency": now - self.arrived,
            "ttft": (self.first_token_at or now) - self.arrived,
            "spec_verify_ct": self.verify_ct,
            "spec_accept_length": completion / max(self.verify_ct, 1),
            "spec_accept_histogram": self.histogram,
            "spec_accept_by_position": self.by_position,
            "spec_num_proposed_drafts": self.proposed,
            "spec_num_correct_drafts": self.correct,
            "spec_accept_rate": self.correct / self.proposed if self.proposed else None,
            "draft_time": self.draft_time,
            "verify_time": self.verify_time,
            "method": method,
            "drafter_version": drafter_version,
        }
        return Output(self.request.rid, self.request.prompt_text, self.request.prompt_ids, list(self.output_ids), text,
                      meta)
