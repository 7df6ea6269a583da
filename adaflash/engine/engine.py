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

from adaflash.engine.graphs import GraphRunner, bucket
from adaflash.engine.params import Output, Request
from adaflash.engine.sampling import sample
from adaflash.models.drafters import DFlashDrafter, Drafter
from adaflash.models.loading import Target

BLOCK_METHODS = ("dflash", "adaflash", "osd")
CHAIN_METHODS = ("eagle3", "mtp")


@dataclass
class _Seq:
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
        cuda_graphs: bool | None = None,
        pad_shapes: bool | None = None,
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
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs needs the target on a CUDA device")
        # Decode passes are replayed from CUDA graphs on a GPU (shapes padded to buckets);
        # on CPU they run eagerly at their exact shapes, where padding would cost real work.
        self.graphs = GraphRunner(on_cuda if cuda_graphs is None else cuda_graphs)
        self.padded = self.graphs.enabled if pad_shapes is None else pad_shapes  # the tests pad on CPU too
        if self.graphs.enabled and not self.padded:
            raise ValueError("CUDA graphs replay fixed shapes: pad_shapes cannot be off with cuda_graphs")
        # One slot beyond max_batch takes the writes of padding rows.
        self.scratch = max_batch
        self.cache = self.model.new_cache(max_batch + 1, self.max_len, static=self.graphs.enabled)
        self.tokens = torch.zeros(max_batch + 1, self.max_len + 1, dtype=torch.long, device=self.device)
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
        drafter.bind_head(self.model, self.model.dtype)
        self.drafter = drafter
        self.drafter_version = version
        self.capture = list(drafter.target_layer_ids)
        width = drafter.feature_size
        if self.feats is None or self.feats.shape[-1] != width:
            length = self.max_len if self.graphs.enabled else min(self.max_len, 256)
            self.feats = torch.zeros(self.max_batch + 1, length, width, device=self.device, dtype=self.model.dtype)
        self.draft_cache = drafter.new_cache(self.max_batch + 1, self.max_len + drafter.max_draft + 2,
                                             static=self.graphs.enabled)

    def _ensure_feats(self, length: int) -> None:
        """Grow the feature buffer (doubling, like the KV cache) to hold `length` positions."""
        assert self.feats is not None
        have = self.feats.shape[1]
        if length > have:
            grown = min(self.max_len, max(length, 2 * have))
            extra = self.feats.new_zeros(self.feats.shape[0], grown - have, self.feats.shape[-1])
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
        if _same_shapes(self.drafter, drafter):
            # Copy into the running modules: captured graphs keep pointing at valid weights.
            with torch.no_grad():
                self.drafter.load_state_dict(drafter.state_dict())
                self.drafter.bind_head(self.model, self.model.dtype)
            self.drafter_version = version
        else:
            self.graphs.clear()
            self._install_drafter(drafter, version)
        if self.active:
            seqs = [self.active[slot] for slot in sorted(self.active)]
            rows = torch.tensor([s.slot for s in seqs], device=self.device)
            lens = torch.tensor([s.length for s in seqs], device=self.device)
            self._extend_drafter(rows, torch.zeros_like(lens), lens, 0, max(s.length for s in seqs), graph=False)

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
            seq.length = lens[i]
        rows = torch.tensor([s.slot for s in admitted], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(admitted), width)
        length = torch.tensor(lens, device=self.device)
        logits, feats = self.model(ids, positions, self.cache, rows, capture=self.capture,
                                   logits_index=length - 1, kv_len=width)
        self.cache.lens[rows] = length
        self.tokens[rows, :width] = ids
        first = self._sample(logits, admitted)
        self.tokens[rows, length] = first
        if self.drafter is not None:
            self._ensure_feats(width)
            self.feats[rows, :width] = torch.cat(feats, dim=-1)
            self._extend_drafter(rows, torch.zeros_like(length), length, 0, width, graph=False)
        firsts = first.tolist()
        elapsed = time.perf_counter() - started
        events = []
        for i, seq in enumerate(admitted):
            self.active[seq.slot] = seq
            seq.verify_ct += 1
            seq.verify_time += elapsed
            events.append(self._emit(seq, [firsts[i]], accepted=0, proposed=0))
        return events

    # -- padding to captured shapes -------------------------------------------------------------
    @property
    def _widest(self) -> int:
        """The widest verified block: the pending token plus every draft."""
        return (self.drafter.max_draft if self.drafter is not None else 0) + 1

    def _kv_bucket(self, length: int) -> int:
        return bucket(length, self.cache.max_len, floor=128) if self.padded else length

    def _dims(self, b: int, width: int, base: int) -> tuple[int, int, int]:
        """(batch, width, kv length) of a pass whose rows start at most at `base`.

        Padded to buckets when replaying graphs, so a few graphs serve every step; exact on CPU,
        where padding would cost real work.
        """
        if not self.padded:
            return b, width, base + width
        b_pad, w_pad = bucket(b, self.max_batch), bucket(width, max(self._widest, width))
        return b_pad, w_pad, self._kv_bucket(base + w_pad)

    def _pad_rows(self, rows: torch.Tensor, size: int) -> torch.Tensor:
        return torch.cat([rows, rows.new_full((size - rows.shape[0],), self.scratch)])

    @staticmethod
    def _pad(x: torch.Tensor, b: int, width: int | None = None, fill: int = 0) -> torch.Tensor:
        """Pad dim 0 to b (and dim 1 to width) with `fill`."""
        shape = [b, *x.shape[1:]]
        if width is not None:
            shape[1] = width
        if list(x.shape) == shape:
            return x
        out = x.new_full(shape, fill)
        if x.dim() > 1:
            out[: x.shape[0], : x.shape[1]] = x
        else:
            out[: x.shape[0]] = x
        return out

    def _positions(self, start: torch.Tensor, b: int, width: int) -> torch.Tensor:
        """start + 0..width-1 per row; padding rows count from 0 in the scratch slot."""
        return self._pad(start, b)[:, None] + torch.arange(width, device=self.device)

    @torch.no_grad()
    def capture_graphs(self, max_context: int | None = None) -> int:
        """Capture every decode graph a server can meet, so no request pays for a capture.

        Covers each batch bucket × kv-length bucket (up to `max_context`) × block width. Inputs
        point at the scratch slot, so no sequence is touched. Returns the number of graphs.
        """
        if not self.graphs.enabled:
            return 0
        top = self._kv_bucket(min(max_context or self.cache.max_len, self.cache.max_len))
        kvs, kv = [], 128
        while kv < top:
            kvs.append(kv)
            kv *= 2
        kvs.append(top)
        widest = self._widest
        widths = sorted({bucket(w, widest) for w in range(1, widest + 1)})
        batches = sorted({bucket(b, self.max_batch) for b in range(1, self.max_batch + 1)})
        zeros = lambda b, w=None: torch.zeros((b,) if w is None else (b, w), dtype=torch.long, device=self.device)  # noqa: E731
        for b in batches:
            rows = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
            for kv in kvs:
                for w in widths:
                    if kv - w < 0:
                        continue
                    self._verify(rows, zeros(b, w), zeros(b) + kv - w, kv - w)
                    if self.drafter is not None:
                        self._extend_drafter(rows, zeros(b) + kv - w, zeros(b) + 1, kv - w, w)
                if self.drafter is not None:
                    self._draft(rows, zeros(b), zeros(b) + kv - widest, kv - widest)
        return len(self.graphs)

    # -- the passes ------------------------------------------------------------------------------
    def _extend_drafter(self, rows: torch.Tensor, start: torch.Tensor, count: torch.Tensor, base: int,
                        width: int, *, graph: bool = True) -> None:
        """Give the drafter the target features of positions [start, start + count) per row.

        `base` >= every start and `width` >= every count are host-side bounds. `graph=False` runs
        eagerly (prefill and hot swap, whose widths are prompt lengths, each a shape of its own).
        """
        assert self.drafter is not None and self.feats is not None
        b = rows.shape[0]
        b_pad, w_pad, kv = self._dims(b, width, base) if graph else (b, width, base + width)
        rows_p = self._pad_rows(rows, b_pad)
        positions = self._positions(start, b_pad, w_pad)
        safe = positions.clamp(max=self.feats.shape[1] - 1)
        inputs = [rows_p, positions, self.feats[rows_p[:, None], safe], self.tokens[rows_p[:, None], safe + 1],
                  self._pad(count, b_pad, fill=1)]
        drafter, cache, model = self.drafter, self.draft_cache, self.model

        def extend(rows_p, positions, feats, next_tokens, count_p):
            drafter.extend(cache, rows_p, positions, feats, next_tokens, count_p, model, kv)

        if graph:
            self.graphs.run(("extend", b_pad, w_pad, kv), extend, inputs)
        else:
            extend(*inputs)
        self.draft_cache.lens[rows] = start + count

    def _verify(self, rows: torch.Tensor, block: torch.Tensor, lens: torch.Tensor,
                longest: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target pass over [pending, drafts] at each row's positions: logits and drafter features."""
        b, width = block.shape
        b_pad, w_pad, kv = self._dims(b, width, longest)
        rows_p = self._pad_rows(rows, b_pad)
        positions = self._positions(lens, b_pad, w_pad)
        model, cache, capture = self.model, self.cache, self.capture

        def verify(block_p, positions, rows_p):
            logits, feats = model(block_p, positions, cache, rows_p, capture=capture, kv_len=kv)
            return logits, (torch.cat(feats, dim=-1) if feats else None)

        logits, feats = self.graphs.run(("verify", b_pad, w_pad, kv), verify,
                                        [self._pad(block, b_pad, w_pad), positions, rows_p])
        return logits[:b, :width], (feats[:b, :width] if feats is not None else None)

    @torch.no_grad()
    def _decode(self, seqs: list[_Seq]) -> list[StepEvent]:
        rows = torch.tensor([s.slot for s in seqs], device=self.device)
        pending = torch.tensor([s.pending for s in seqs], device=self.device)
        lens = torch.tensor([s.length for s in seqs], device=self.device)
        longest = max(s.length for s in seqs)
        t0 = time.perf_counter()
        drafts, verify_n = self._draft(rows, pending, lens, longest)
        t1 = time.perf_counter()
        k = drafts.shape[1]
        block = torch.cat([pending[:, None], drafts], dim=1)
        logits, feats = self._verify(rows, block, lens, longest)
        posterior = self._sample(logits.reshape(-1, logits.shape[-1]), seqs, repeat=k + 1).view(len(seqs), k + 1)
        if k:
            valid = torch.arange(k, device=self.device)[None, :] < verify_n[:, None]
            match = (drafts == posterior[:, :k]) & valid
            accepted = match.long().cumprod(dim=1).sum(dim=1)
        else:
            accepted = torch.zeros(len(seqs), dtype=torch.long, device=self.device)
        bonus = posterior.gather(1, accepted[:, None]).squeeze(1)
        self.cache.lens[rows] = lens + accepted + 1
        # tokens[p] holds the token at position p: the accepted drafts, then the bonus token,
        # which becomes the new pending token. Writes past it are overwritten before any read.
        emitted = torch.cat([drafts, bonus[:, None]], dim=1)
        emitted.scatter_(1, accepted[:, None], bonus[:, None])
        idx = (lens[:, None] + torch.arange(1, k + 2, device=self.device)).clamp(max=self.max_len)
        self.tokens[rows[:, None], idx] = emitted
        if self.drafter is not None:
            fidx = (lens[:, None] + torch.arange(k + 1, device=self.device)).clamp(max=self.max_len - 1)
            self._ensure_feats(longest + k + 1)
            self.feats[rows[:, None], fidx] = feats
        # The one host sync of a step: how many tokens each row accepted.
        acc_list, n_list, emit_list = accepted.tolist(), verify_n.tolist(), emitted.tolist()
        t2 = time.perf_counter()
        if self.drafter is not None:
            self._extend_drafter(rows, lens, accepted + 1, longest, max(acc_list) + 1)
        t3 = time.perf_counter()
        events = []
        for i, seq in enumerate(seqs):
            seq.verify_ct += 1
            seq.length += acc_list[i] + 1
            seq.draft_time += (t1 - t0) + (t3 - t2)
            seq.verify_time += t2 - t1
            n_acc = acc_list[i]
            events.append(self._emit(seq, emit_list[i][: n_acc + 1], accepted=n_acc, proposed=n_list[i]))
        return events

    def _draft(self, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor,
               longest: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens [b, K] and how many of them each row verifies [b]."""
        b = rows.shape[0]
        drafter = self.drafter
        if drafter is None:
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), torch.zeros(b, dtype=torch.long, device=self.device)
        steps = self.num_steps
        if self.verify_length is not None:
            steps = min(max(self.verify_length - 1, 1), drafter.max_draft)
        head = self.use_length_head and self.verify_length is None
        if head and not self.padded and isinstance(drafter, DFlashDrafter) and drafter.length_head is not None:
            # Eager (CPU): run the block, let the head choose, then pay lm_head only for what is verified.
            hidden = drafter.block_hidden(self.draft_cache, rows, pending, lens, self.model, longest)
            verify_n = self._choose_lengths(drafter.predict_length(hidden), drafter.max_draft)
            return drafter.tokens(hidden, int(verify_n.max()), self.model), verify_n
        b_pad = self._dims(b, 1, longest)[0]
        ctx = self._kv_bucket(longest)
        cache, model = self.draft_cache, self.model

        def draft(rows_p, pending_p, lens_p):
            return drafter.draft(cache, rows_p, pending_p, lens_p, model, ctx, steps=steps)

        drafts, length_pred = self.graphs.run(
            ("draft", b_pad, ctx, steps), draft,
            [self._pad_rows(rows, b_pad), self._pad(pending, b_pad), self._pad(lens, b_pad)])
        drafts = drafts[:b]
        k = drafts.shape[1]
        if head and length_pred is not None:
            verify_n = self._choose_lengths(length_pred[:b], k)
            return drafts[:, : int(verify_n.max())], verify_n
        return drafts, torch.full((b,), k, dtype=torch.long, device=self.device)

    def _choose_lengths(self, length_pred: torch.Tensor, k: int) -> torch.Tensor:
        """The length head's ratio → drafted tokens to verify per row (at least min_length - 1)."""
        block = self.drafter.block_size if self.drafter is not None else k + 1
        want = torch.round(length_pred.float() * block * self.length_rate).long()
        return (want.clamp(min=self.min_length, max=block) - 1).clamp(max=k)

    def _sample(self, logits: torch.Tensor, seqs: list[_Seq], repeat: int = 1) -> torch.Tensor:
        params = [s.request.params for s in seqs]
        if all(p.temperature == 0 for p in params):
            return logits.argmax(-1)  # decided on the host: no device round trip for greedy batches
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


def _same_shapes(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape for k in sa)
