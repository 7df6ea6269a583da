"""The embedded engine: slots, prefill, draft → verify → accept, stop handling, hot swap.

Every method runs through one step function. Vanilla is the special case "no drafts": the
target verifies only the pending token and emits its own next token. A step for a batch is:
  1. the drafter proposes up to K tokens per row (block drafters in one pass, chain drafters
     one token at a time); the AdaFlash length head may shorten each row's candidate;
  2. the target runs [pending, drafts...] at each row's own positions and samples a posterior
     token at every position (greedy when T == 0);
  3. a row accepts the longest prefix where draft[i] == posterior[i] and emits those drafts plus
     posterior[accepted] (sample-and-match: every emitted token is a target sample, so the
     output distribution is the target's);
  4. rejected positions are rolled back by setting the cache length; the accepted positions'
     target features extend the drafter's context.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from adaflash.engine.params import Output, Request
from adaflash.engine.sampling import sample
from adaflash.models.drafters import Drafter
from adaflash.models.loading import Target

BLOCK_METHODS = ("dflash", "adaflash", "osd")
CHAIN_METHODS = ("eagle3", "mtp")


@dataclass
class _Seq:
    request: Request
    slot: int
    arrived: float
    output_ids: list[int] = field(default_factory=list)
    pending: int = -1
    verify_ct: int = 0
    proposed: int = 0
    correct: int = 0
    histogram: list[int] = field(default_factory=list)
    draft_time: float = 0.0
    verify_time: float = 0.0
    first_token_at: float | None = None
    finish: dict[str, Any] | None = None
    text: str = ""


@dataclass
class StepEvent:
    """What one step produced for one request: new token ids, and the Output once it finished."""

    rid: str
    new_ids: list[int]
    output: Output | None = None


class Engine:
    def __init__(
        self,
        target: Target,
        method: str = "vanilla",
        drafter: Drafter | None = None,
        *,
        max_batch: int = 16,
        max_len: int | None = None,
        length_rate: float = 1.0,
        min_length: int = 2,
        num_steps: int | None = None,
        use_length_head: bool | None = None,
        verify_length: int | None = None,
        seed: int = 0,
    ) -> None:
        if method != "vanilla" and drafter is None:
            raise ValueError(f"method {method!r} needs a drafter (--draft DIR)")
        if drafter is not None:
            wanted = "block" if method in BLOCK_METHODS else "chain"
            if method == "vanilla":
                drafter = None
            elif drafter.kind != wanted:
                raise ValueError(f"method {method!r} needs a {wanted} drafter, got a {drafter.kind} drafter ({drafter.method})")
        self.target = target
        self.method = method
        self.model = target.model
        self.device = self.model.device
        self.max_batch = max_batch
        self.max_len = int(max_len or min(target.max_context, 4096))
        self.length_rate = length_rate
        self.min_length = min_length
        self.num_steps = num_steps
        self.use_length_head = (method == "adaflash") if use_length_head is None else use_length_head
        self.verify_length = verify_length  # a fixed block length to verify (baseline for the head)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.cache = self.model.new_cache(max_batch, self.max_len)
        self.tokens = torch.zeros(max_batch, self.max_len + 1, dtype=torch.long, device=self.device)
        self.drafter: Drafter | None = None
        self.drafter_version: int | None = None
        self.capture: list[int] = []
        self.feats: torch.Tensor | None = None
        self.waiting: deque[Request] = deque()
        self.active: dict[int, _Seq] = {}
        self.stats = {"verify_ct": 0, "completion_tokens": 0, "requests": 0}
        if drafter is not None:
            self._install_drafter(drafter)

    # -- drafter management -----------------------------------------------------------------
    def _install_drafter(self, drafter: Drafter, version: int | None = None) -> None:
        drafter = drafter.to(device=self.device, dtype=self.model.dtype).eval()
        self.drafter = drafter
        self.drafter_version = version
        self.capture = list(drafter.target_layer_ids)
        width = drafter.feature_size
        if self.feats is None or self.feats.shape[-1] != width:
            self.feats = torch.zeros(self.max_batch, min(self.max_len, 256), width, device=self.device,
                                     dtype=self.model.dtype)
        self.draft_cache = drafter.new_cache(self.max_batch, self.max_len + drafter.max_draft + 2)

    def _ensure_feats(self, length: int) -> None:
        """Grow the feature buffer (doubling, like the KV cache) to hold `length` positions."""
        assert self.feats is not None
        have = self.feats.shape[1]
        if length > have:
            grown = min(self.max_len, max(length, 2 * have))
            extra = self.feats.new_zeros(self.max_batch, grown - have, self.feats.shape[-1])
            self.feats = torch.cat([self.feats, extra], dim=1)

    def swap_drafter(self, drafter: Drafter, version: int | None = None) -> None:
        """Hot swap between steps: in-flight requests keep going with the new drafter.

        The drafter's context cache depends on its weights, so it is rebuilt from the target
        features and tokens the engine keeps for every active row.
        """
        if self.drafter is None:
            raise ValueError("this engine runs without a drafter; nothing to swap")
        if drafter.kind != self.drafter.kind or list(drafter.target_layer_ids) != self.capture:
            raise ValueError("the new drafter does not match the running one (kind or target_layer_ids differ)")
        self._install_drafter(drafter, version)
        if self.active:
            rows = torch.tensor(sorted(self.active), device=self.device)
            lens = self.cache.lens[rows]
            self._extend_drafter(rows, torch.zeros_like(lens), lens)

    # -- queue ------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.check(request)
        self.waiting.append(request)

    def check(self, request: Request) -> None:
        """The checks `add` makes, without queuing: a server runs them before handing a request over."""
        params = request.params
        params.validate()
        if not request.prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.cfg.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in request.prompt_ids):
            raise ValueError(f"input_ids must be integers in [0, {vocab})")
        need = len(request.prompt_ids) + params.max_new_tokens + (self.drafter.max_draft if self.drafter else 0) + 2
        if need > self.max_len:
            raise ValueError(
                f"prompt ({len(request.prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                f"exceeds the context of {self.max_len} tokens"
            )

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def generate(self, requests: Iterable[Request],
                 on_event: Callable[[StepEvent], None] | None = None) -> list[Output]:
        """Run requests to completion (batched); outputs in the order given."""
        order = []
        for request in requests:
            self.add(request)
            order.append(request.rid)
        done: dict[str, Output] = {}
        while self.has_work():
            for event in self.step():
                if on_event:
                    on_event(event)
                if event.output is not None:
                    done[event.rid] = event.output
        return [done[rid] for rid in order]

    # -- one engine step ----------------------------------------------------------------------
    def step(self) -> list[StepEvent]:
        events: list[StepEvent] = []
        if self.waiting and len(self.active) < self.max_batch:
            events += self._prefill()
        decoding = [s for s in self.active.values() if s.verify_ct > 0 and s.finish is None]
        if decoding:
            events += self._decode(decoding)
        return events

    def _free_slots(self) -> list[int]:
        return [i for i in range(self.max_batch) if i not in self.active]

    @torch.no_grad()
    def _prefill(self) -> list[StepEvent]:
        admitted: list[_Seq] = []
        for slot in self._free_slots():
            if not self.waiting:
                break
            admitted.append(_Seq(self.waiting.popleft(), slot, time.perf_counter()))
        started = time.perf_counter()
        lens = [len(s.request.prompt_ids) for s in admitted]
        width = max(lens)
        ids = torch.zeros(len(admitted), width, dtype=torch.long, device=self.device)
        for i, seq in enumerate(admitted):
            ids[i, : lens[i]] = torch.tensor(seq.request.prompt_ids, device=self.device)
        rows = torch.tensor([s.slot for s in admitted], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(admitted), width)
        length = torch.tensor(lens, device=self.device)
        logits, feats = self.model(ids, positions, self.cache, rows, capture=self.capture,
                                   logits_index=length - 1)
        self.cache.lens[rows] = length
        self.tokens[rows, :width] = ids
        first = self._sample(logits, admitted)
        self.tokens[rows, length] = first
        if self.drafter is not None:
            self._ensure_feats(width)
            self.feats[rows, :width] = torch.cat(feats, dim=-1)
            self._extend_drafter(rows, torch.zeros_like(length), length)
        elapsed = time.perf_counter() - started
        events = []
        for i, seq in enumerate(admitted):
            self.active[seq.slot] = seq
            seq.verify_ct += 1
            seq.verify_time += elapsed
            events.append(self._emit(seq, [int(first[i])], accepted=0, proposed=0))
        return events

    def _extend_drafter(self, rows: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> None:
        """Give the drafter the target features of positions [start, start + count) per row."""
        assert self.drafter is not None and self.feats is not None
        width = int(count.max())
        offsets = torch.arange(width, device=self.device)
        positions = start[:, None] + offsets
        safe = positions.clamp(max=self.feats.shape[1] - 1)
        feats = self.feats[rows[:, None], safe]
        next_tokens = self.tokens[rows[:, None], safe + 1]
        self.drafter.extend(self.draft_cache, rows, positions, feats, next_tokens, count, self.model)
        self.draft_cache.lens[rows] = start + count

    @torch.no_grad()
    def _decode(self, seqs: list[_Seq]) -> list[StepEvent]:
        rows = torch.tensor([s.slot for s in seqs], device=self.device)
        pending = torch.tensor([s.pending for s in seqs], device=self.device)
        lens = self.cache.lens[rows]
        t0 = time.perf_counter()
        drafts, verify_n = self._draft(rows, pending, lens)
        t1 = time.perf_counter()
        k = drafts.shape[1]
        block = torch.cat([pending[:, None], drafts], dim=1)
        positions = lens[:, None] + torch.arange(k + 1, device=self.device)
        logits, feats = self.model(block, positions, self.cache, rows, capture=self.capture)
        posterior = self._sample(logits.reshape(-1, logits.shape[-1]), seqs, repeat=k + 1).view(len(seqs), k + 1)
        if k:
            valid = torch.arange(k, device=self.device)[None, :] < verify_n[:, None]
            match = (drafts == posterior[:, :k]) & valid
            accepted = match.long().cumprod(dim=1).sum(dim=1)
        else:
            accepted = torch.zeros(len(seqs), dtype=torch.long, device=self.device)
        t2 = time.perf_counter()
        bonus = posterior.gather(1, accepted[:, None]).squeeze(1)
        new_lens = lens + accepted + 1
        self.cache.lens[rows] = new_lens
        # tokens[p] holds the token at position p: the accepted drafts, then the bonus token,
        # which becomes the new pending token. Writes past it are overwritten before any read.
        emitted = torch.cat([drafts, bonus[:, None]], dim=1)
        emitted.scatter_(1, accepted[:, None], bonus[:, None])
        idx = (lens[:, None] + torch.arange(1, k + 2, device=self.device)).clamp(max=self.max_len)
        self.tokens[rows[:, None], idx] = emitted
        if self.drafter is not None:
            cat = torch.cat(feats, dim=-1)
            fidx = (lens[:, None] + torch.arange(k + 1, device=self.device)).clamp(max=self.max_len - 1)
            self._ensure_feats(int(fidx.max()) + 1)
            self.feats[rows[:, None], fidx] = cat
            self._extend_drafter(rows, lens, accepted + 1)
        t3 = time.perf_counter()
        events = []
        acc_list, n_list, emit_list = accepted.tolist(), verify_n.tolist(), emitted.tolist()
        for i, seq in enumerate(seqs):
            seq.verify_ct += 1
            seq.draft_time += t1 - t0
            seq.verify_time += (t2 - t1) + (t3 - t2)
            n_acc = acc_list[i]
            events.append(self._emit(seq, emit_list[i][: n_acc + 1], accepted=n_acc, proposed=n_list[i]))
        return events

    def _draft(self, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens [b, K] and how many of them each row verifies [b]."""
        b = rows.shape[0]
        if self.drafter is None:
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), torch.zeros(b, dtype=torch.long, device=self.device)
        drafts, length_pred = self.drafter.draft(self.draft_cache, rows, pending, lens, self.model,
                                                 steps=self.num_steps)
        k = drafts.shape[1]
        verify_n = torch.full((b,), k, dtype=torch.long, device=self.device)
        if self.verify_length is not None:
            drafts = drafts[:, : max(self.verify_length - 1, 0)]
            verify_n = verify_n.clamp(max=drafts.shape[1])
        elif self.use_length_head and length_pred is not None:
            block = self.drafter.block_size
            want = torch.round(length_pred.float() * block * self.length_rate).long()
            verify_n = want.clamp(min=self.min_length, max=block) - 1
            verify_n = verify_n.clamp(max=k)
            k_max = int(verify_n.max())
            drafts = drafts[:, :k_max]
        return drafts, verify_n

    def _sample(self, logits: torch.Tensor, seqs: list[_Seq], repeat: int = 1) -> torch.Tensor:
        params = [s.request.params for s in seqs]
        temps = torch.tensor([p.temperature for p in params], device=self.device).repeat_interleave(repeat)
        top_p = torch.tensor([p.top_p for p in params], device=self.device).repeat_interleave(repeat)
        top_k = torch.tensor([p.top_k for p in params], device=self.device).repeat_interleave(repeat)
        return sample(logits, temps, top_p, top_k, self.generator)

    # -- emission and stop handling --------------------------------------------------------------
    def _emit(self, seq: _Seq, new_ids: list[int], *, accepted: int, proposed: int) -> StepEvent:
        now = time.perf_counter()
        if seq.first_token_at is None:
            seq.first_token_at = now
        if proposed:
            seq.proposed += proposed
            seq.correct += accepted
            while len(seq.histogram) <= accepted:
                seq.histogram.append(0)
            seq.histogram[accepted] += 1
        params = seq.request.params
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.target.eos_ids))
        taken: list[int] = []
        for token in new_ids:
            taken.append(token)
            seq.output_ids.append(token)
            if token in stop_ids:
                seq.finish = {"type": "stop", "matched": token}
                break
            if params.stop and self._check_stop_strings(seq):
                break
            if len(seq.output_ids) >= params.max_new_tokens:
                seq.finish = {"type": "length", "length": params.max_new_tokens}
                break
        seq.pending = new_ids[-1]
        if seq.finish is None:
            return StepEvent(seq.request.rid, taken)
        del self.active[seq.slot]
        return StepEvent(seq.request.rid, taken, self._output(seq, now))

    def _check_stop_strings(self, seq: _Seq) -> bool:
        text = self.target.decode(seq.output_ids)
        for stop in seq.request.params.stop:
            at = text.find(stop)
            if at >= 0:
                seq.finish = {"type": "stop", "matched": stop}
                seq.text = text[:at]
                return True
        return False

    def _output(self, seq: _Seq, now: float) -> Output:
        text = seq.text if seq.finish and isinstance(seq.finish.get("matched"), str) else self.target.decode(seq.output_ids)
        completion = len(seq.output_ids)
        self.stats["verify_ct"] += seq.verify_ct
        self.stats["completion_tokens"] += completion
        self.stats["requests"] += 1
        meta = {
            "id": seq.request.rid,
            "prompt_tokens": len(seq.request.prompt_ids),
            "completion_tokens": completion,
            "finish_reason": seq.finish,
            "e2e_latency": now - seq.arrived,
            "ttft": (seq.first_token_at or now) - seq.arrived,
            "spec_verify_ct": seq.verify_ct,
            "spec_accept_length": completion / max(seq.verify_ct, 1),
            "spec_accept_histogram": seq.histogram,
            "spec_num_proposed_drafts": seq.proposed,
            "spec_num_correct_drafts": seq.correct,
            "spec_accept_rate": seq.correct / seq.proposed if seq.proposed else None,
            "draft_time": seq.draft_time,
            "verify_time": seq.verify_time,
            "method": self.method,
            "drafter_version": self.drafter_version,
        }
        return Output(seq.request.rid, seq.request.prompt_text, list(seq.output_ids), text, meta)

    @property
    def avg_accept_length(self) -> float | None:
        if not self.stats["verify_ct"]:
            return None
        return self.stats["completion_tokens"] / self.stats["verify_ct"]
