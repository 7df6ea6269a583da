"""The embedded engine: slots, admission and prefill, draft → verify → accept, hot swap.

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
This module schedules, samples, accepts and emits. Each request's tokens, stops and Output are
`sequence.RunningSeq`'s; the passes themselves (padded shapes, CUDA graphs, caches) run in
`passes.DevicePasses`. On a GPU a greedy step that needs no host choice is overlapped with the host's
work on the step before (`flight`); when prompts are admitted is `admission`'s. How many drafts a step
verifies is `verify_lengths`'s.
"""

from __future__ import annotations

import gc
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from adaflash.engine.admission import Admitting
from adaflash.engine.capture import capture_all
from adaflash.engine.config import EngineConfig
from adaflash.engine.flight import Flight, Overlapping
from adaflash.engine.graphs import GraphRunner
from adaflash.engine.length_policy import Plan
from adaflash.engine.params import Output, Request
from adaflash.engine.passes import DevicePasses, LengthChooser
from adaflash.engine.sampling import accept, sample_for
from adaflash.engine.scripted import ScriptedAcceptance
from adaflash.engine.sequence import RunningSeq
from adaflash.engine.verify_lengths import VerifyLengths
from adaflash.methods import VANILLA, Method, method_of
from adaflash.models.cache import KVCache
from adaflash.models.drafters import Drafter
from adaflash.models.loading import Target


def fitting_drafter(method: Method, drafter: Drafter | None) -> Drafter | None:
    """The drafter `method` runs, checked against the method table (Vanilla drops any drafter given)."""
    if not method.needs_drafter:
        return None
    if drafter is None:
        raise ValueError(f"method {method.name!r} needs a drafter (--draft DIR)")
    if drafter.kind != method.kind:
        raise ValueError(f"method {method.name!r} needs a {method.kind} drafter, got a {drafter.kind} drafter "
                         f"({drafter.method})")
    if method.length_head and not drafter.predicts_length:
        raise ValueError(f"method {method.name!r} needs a DFlash drafter with a length head; this {drafter.method} "
                         "drafter has none (create one with `adaflash draft new --length-head` or "
                         "`adaflash train length-head`)")
    return drafter


@dataclass
class StepEvent:
    """What one step produced for one request: new token ids, and the Output once it finished."""

    rid: str
    new_ids: list[int]
    output: Output | None = None


class Engine(Admitting, Overlapping, VerifyLengths):
    """Schedules requests into slots, samples and accepts tokens, and emits them.

    The device work (padded passes, CUDA graphs, caches) lives in `self.passes`.
    """

    def __init__(
        self,
        target: Target,
        method: str = VANILLA,
        drafter: Drafter | None = None,
        *,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        drafter = fitting_drafter(method_of(method), drafter)
        cfg = self.config = config or EngineConfig()
        target.ensure_tokenizer()  # its eos ids end rows
        self.target = target
        self.method = method
        self.model = target.model
        self.device = self.model.device
        self.max_batch = cfg.max_batch
        self.max_len = int(cfg.max_len or min(target.max_context, 4096))
        self._init_verify_lengths(method, cfg)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.passes = DevicePasses(self.model, max_batch=cfg.max_batch, max_len=self.max_len,
                                   cuda_graphs=cfg.cuda_graphs, pad_shapes=cfg.pad_shapes)
        self.passes.exact_widths = self._reads_head()
        # Fewest prompts worth a prefill while rows are decoding (None: max_batch // 8 on padded shapes, else 1).
        # On a GPU a prefill costs about the same for one prompt as for a dozen (a padded pass, or eager
        # ops when too wide for a graph), and more than a decode step, so admitting each prompt the
        # moment a row finishes makes a full batch spend much of its time prefilling.
        self.admit_batch = cfg.admit_batch if cfg.admit_batch is not None else (
            max(1, cfg.max_batch // 8) if self.passes.padded else 1)
        self.drafter_version: int | None = None
        # Request times (arrival, first token, finish) read this clock: a bench that lets engines take
        # turns gives each its own, which stands still while the others run.
        self.clock = clock
        self.waiting: deque[tuple[Request, float]] = deque()  # with the time each arrived
        self.active: dict[int, RunningSeq] = {}
        self.stats = {"verify_ct": 0, "completion_tokens": 0, "requests": 0}
        # Passes by kind, with their host-clock seconds (each ends on a host read, so they are the
        # device's too): "prefill", "decode" (no drafter), and speculative steps "whole" (every draft
        # verified, the head unread), "choose" (the head picked the width), "probe" (the cost rule
        # timing a width).
        self.step_counts: Counter[str] = Counter()
        self.step_seconds: Counter[str] = Counter()
        self.step_rows: Counter[str] = Counter()  # rows each pass of the kind stepped (a prefill: its prompts)
        # Launch a greedy step before the host takes the last one's tokens (`step`); None: on padded
        # shapes (a GPU), where the host's work would leave the device idle. On a CPU every op runs
        # as it is called, so there is nothing to overlap.
        self.overlap = self.passes.padded if cfg.overlap is None else cfg.overlap
        self._flight: Flight | None = None
        self._left: list[RunningSeq] = []  # rows that left the batch since the flight's launch (`_land`)
        self._settled: list[StepEvent] = []  # events of a flight read outside `step`
        if drafter is not None:
            self.passes.install_drafter(drafter)

    # -- the device side, as callers and tests see it -------------------------------------------
    @property
    def drafter(self) -> Drafter | None:
        return self.passes.drafter

    @property
    def graphs(self) -> GraphRunner:
        return self.passes.graphs

    @graphs.setter
    def graphs(self, runner: GraphRunner) -> None:
        self.passes.graphs = runner

    @property
    def padded(self) -> bool:
        return self.passes.padded

    @padded.setter
    def padded(self, value: bool) -> None:
        self.passes.padded = value

    @property
    def script(self) -> ScriptedAcceptance | None:
        """A benchmark's scripted drafts (`engine.scripted`): set before graphs are captured."""
        return self.passes.script

    @script.setter
    def script(self, script: ScriptedAcceptance | None) -> None:
        if script is not None:
            if self.drafter is None:
                raise ValueError("scripted acceptance needs a drafter: it replaces the drafter's tokens")
            script.check(self.drafter)
        self.passes.script = script

    @property
    def tokens(self) -> torch.Tensor:
        return self.passes.tokens

    @property
    def draft_cache(self) -> KVCache:
        return self.passes.draft_cache

    def capture_graphs(self, max_context: int | None = None) -> int:
        """Capture every decode graph a server can meet, so no request pays for a capture; then move every
        object alive to the collector's permanent generation (`gc.freeze`).

        Why the freeze: a full collection walks every tracked object, and a process holding torch,
        transformers and a few thousand captured graphs has hundreds of thousands (350,000 on a CPU with a
        tiny target): one took about 200 ms there, dozens of steps' time at batch 512, at a moment no step
        chooses. Frozen, the same collection took 2.5 ms (`gc` callbacks, `engine.step` at batch 512 with the
        device's work stubbed). An engine holds reference cycles (its graphs' closures point back at its
        passes), so a frozen engine that is dropped would keep its caches for good: each capture first
        thaws what an earlier one froze and collects it, so an engine a benchmark is done with is freed."""
        count = capture_all(self.passes, max_context, steps=self._draft_steps(),
                            choose=self._choose_lengths if self._reads_head() else None, ahead=self._sizes_ahead(),
                            idle=not self.active)
        if count:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        return count

    # -- drafter management -----------------------------------------------------------------
    def swap_drafter(self, drafter: Drafter, version: int | None = None) -> None:
        """Hot swap between steps: in-flight requests keep going with the new drafter.

        The drafter's context cache depends on its weights, so it is rebuilt from the target
        features and tokens the engine keeps for every active row.
        """
        if self.drafter is None:
            raise ValueError("this engine runs without a drafter; nothing to swap")
        if drafter.kind != self.drafter.kind or list(drafter.target_layer_ids) != self.passes.capture:
            raise ValueError("the new drafter does not match the running one (kind or target_layer_ids differ)")
        fitting_drafter(method_of(self.method), drafter)  # an AdaFlash engine keeps a length head
        self._settle()  # the context is rebuilt from every position the target has kept
        self.passes.swap_drafter(drafter)
        self.drafter_version = version
        if self.active:
            seqs = [self.active[slot] for slot in sorted(self.active)]
            self.passes.rebuild_draft_context([s.slot for s in seqs], [s.length for s in seqs])

    # -- queue ------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.check(request)
        self.waiting.append((request, self.clock()))

    def check(self, request: Request) -> None:
        """The checks `add` makes, without queuing: a server runs them before handing a request over."""
        check_request(request, vocab=self.model.cfg.vocab_size, max_len=self.max_len, margin=self.context_margin,
                      drafts=self.drafter is not None)

    @property
    def context_margin(self) -> int:
        """Positions a request may not use: the drafted block beyond its last token, and two more."""
        return (self.drafter.max_draft if self.drafter else 0) + 2

    def abort(self, rid: str) -> bool:
        """Drop a request that is waiting or decoding (its client left); whether it was here. Its slot is
        free for the next admission; what it had produced is not emitted."""
        for index, (request, _arrived) in enumerate(self.waiting):
            if request.rid == rid:
                del self.waiting[index]
                return True
        for seq in list(self.active.values()):
            if seq.request.rid == rid:
                self._leave(seq)
                return True
        return False

    def _leave(self, seq: RunningSeq) -> None:
        """The row leaves the batch (it finished, or was aborted); its slot is free."""
        del self.active[seq.slot]
        if self._flight is not None:
            self._left.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.active or self._settled)

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
        """Admit, then step every decoding row once; the events of what the host read this call.

        Overlapped (`overlap`, on a GPU): a greedy step that needs no host choice is launched and read
        in the next call, and the step after it is launched the moment its tokens are read, before the
        host takes them (stops, events, the caller's work), so the device never waits for that work.
        A row whose stop string only the text shows steps once more for nothing; its result is dropped.
        """
        events, self._settled = self._settled, []
        landed = self._land()  # first: a flight's time is its own, no prefill inside it
        if self._admitting():
            events += self._prefill()
        decoding = self._decoding(landed)
        chooser = self._length_chooser(len(decoding)) if decoding else None  # once a step: it plans
        launched = 0
        if decoding and self._overlappable(decoding, chooser):
            self._flight = self._launch(decoding, *self._ahead_plan(decoding, chooser))
            decoding, launched = None, len(decoding)
        if landed is not None:
            self._account_landed(landed)  # after the launch: the device need not wait for the bookkeeping
            events += self._take_landed(landed)
        if launched:
            self._decide_ahead(launched)  # likewise the rule's mode for the next step
        rest = [s for s in decoding.seqs if self._live(s)] if decoding else []
        if rest:
            events += self._decode(rest, chooser)
        return events

    @torch.no_grad()
    def _decode(self, seqs: list[RunningSeq], chooser: LengthChooser | None) -> list[StepEvent]:
        """One step read at once (not overlapped): sampling rows, a head-chosen width, a CPU."""
        params = [s.request.params for s in seqs]
        greedy = all(p.temperature == 0 for p in params)
        steps = self._draft_steps()
        # Greedy whole-block steps give every row its own result, so free slots may pad the batch.
        slots, in_order, (rows, pending, lens) = self._step_rows(
            [s.slot for s in seqs], [s.pending for s in seqs], [s.length for s in seqs], fill=greedy and chooser is None)
        longest = max(s.length for s in seqs)
        t0 = time.perf_counter()
        if greedy and self.passes.padded and self.drafter is not None and chooser is None \
                and (steps or 0) <= self.drafter.max_draft:
            # Every draft is verified: draft, verify, accept, commit and extend as one replayed pass
            # (its time counts as verify time).
            packed = self.passes.draft_and_step(rows, pending, lens, longest, steps=steps, in_order=in_order).tolist()
            t1 = t0
            t2 = t3 = time.perf_counter()
        else:
            packed, t1, t2, t3 = self._draft_then_verify(rows, pending, lens, longest, params, greedy, steps, chooser,
                                                         t0, in_order, positions=[len(s.output_ids) for s in seqs])
        if len(slots) != len(seqs):
            index = {slot: i for i, slot in enumerate(slots)}
            packed = [packed[index[s.slot]] for s in seqs]
        kind = "decode" if self.drafter is None else "whole" if chooser is None else "choose"
        self._account(seqs, packed, kind, t3 - t0)
        return self._take(seqs, packed, draft_s=(t1 - t0) + (t3 - t2), verify_s=t2 - t1)

    def _account(self, seqs: list[RunningSeq], packed: list[list[int]], kind: str, seconds: float,
                 plan: Plan | None = None) -> None:
        """Count a step by kind; the cost rule learns its time. `plan`: what the rule planned for an overlapped
        step, taken at its launch (it is counted after the next one's launch); else the rule's current plan."""
        if self._reads_head() and self.length_policy == "cost":
            rule = self._cost_rule()
            plan = plan if plan is not None else rule.take_plan()
            kind = rule.mode_of(plan) or kind
            rule.record(len(seqs), max(r[1] for r in packed) + 1, seconds, rows=[(r[0], r[1]) for r in packed],
                        plan=plan)
        self._count(kind, seconds, len(seqs))

    def _take(self, seqs: list[RunningSeq], packed: list[list[int]], *, draft_s: float,
              verify_s: float) -> list[StepEvent]:
        """Each row takes its step's tokens. Per row of `packed`: accepted drafts, verified drafts,
        then the emitted tokens."""
        events = []
        for seq, row in zip(seqs, packed):
            n_acc = row[0]
            seq.verify_ct += 1
            seq.length += n_acc + 1
            seq.draft_time += draft_s
            seq.verify_time += verify_s
            events.append(self._emit(seq, row[2: n_acc + 3], accepted=n_acc, proposed=row[1]))
        return events

    def _step_rows(self, own: Sequence[int] | np.ndarray, pending: Sequence[int] | np.ndarray,
                   lengths: Sequence[int] | np.ndarray, *, fill: bool) -> tuple[list[int], bool, list[torch.Tensor]]:
        """The slots a step runs over (`DevicePasses.rows_for`) for the rows in slots `own` (ascending),
        whether they are 0..b-1 in order, and per row its slot, pending token and length on the device, in
        one host-to-device copy (free slots that pad the batch get zeros). Built in numpy: at batch 256
        `torch.tensor` of the lists took about 90 µs, numpy 11, and the device waits for this between two
        overlapped steps."""
        own = np.asarray(own, dtype=np.int64)
        slots, in_order = self.passes.rows_for(own.tolist(), fill=fill)
        if len(slots) == len(own):  # the rows themselves (`rows_for` pads only by adding free slots)
            columns = np.stack([own, np.asarray(pending, dtype=np.int64), np.asarray(lengths, dtype=np.int64)])
        else:
            columns = np.zeros((3, len(slots)), dtype=np.int64)
            columns[0] = slots
            at = np.searchsorted(columns[0], own)  # both ascending
            columns[1, at], columns[2, at] = pending, lengths
        return slots, in_order, list(torch.from_numpy(columns).to(self.device).unbind(0))

    def pass_totals(self) -> dict[str, dict[str, float]]:
        """Every pass so far by kind, {kind: {steps, seconds, rows}}: where the engine's time went, and how full
        its passes were (rows stepped; a prefill's prompts) (`passes_since`)."""
        return {kind: {"steps": count, "seconds": self.step_seconds[kind], "rows": self.step_rows[kind]}
                for kind, count in self.step_counts.items()}

    def _count(self, kind: str, seconds: float, rows: int) -> None:
        self.step_counts[kind] += 1
        self.step_seconds[kind] += seconds
        self.step_rows[kind] += rows

    def _draft_then_verify(self, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor, longest: int,
                           params: list, greedy: bool, steps: int | None, chooser: LengthChooser | None,
                           t0: float, in_order: bool,
                           positions: list[int] | None = None) -> tuple[list[list[int]], float, float, float]:
        """A step whose drafts the host must see (the head chooses lengths, or rows sample): the packed
        host rows, and when drafting, verifying and extending ended. `in_order`: rows are slots 0..b-1."""
        drafts, verify_n = self.passes.draft(rows, pending, lens, longest, steps=steps, choose=chooser,
                                             in_order=in_order)
        t1 = time.perf_counter()
        if greedy and self.passes.padded:
            # Greedy on padded shapes (a GPU): verify, accept, commit and extend as one replayed pass.
            packed = self.passes.greedy_step(rows, pending, drafts, verify_n, lens, longest, in_order=in_order).tolist()
            t2 = t3 = time.perf_counter()
        else:
            accepted, packed = self._verify(rows, pending, drafts, verify_n, lens, longest, params, greedy, in_order,
                                            positions)
            t2 = time.perf_counter()
            if self.drafter is not None:
                self.passes.extend_drafter(rows, lens, accepted + 1, longest, max(r[0] for r in packed) + 1,
                                           in_order=in_order)
            t3 = time.perf_counter()
        return packed, t1, t2, t3

    def _verify(self, rows: torch.Tensor, pending: torch.Tensor, drafts: torch.Tensor, verify_n: torch.Tensor,
                lens: torch.Tensor, longest: int, params: list, greedy: bool,
                in_order: bool, positions: list[int] | None = None) -> tuple[torch.Tensor, list[list[int]]]:
        """The general verify (any sampling, exact shapes): accepted [b] and the packed host rows.
        `positions`: each row's output position of its block's first target token (seeded sampling)."""
        k = drafts.shape[1]
        block = torch.cat([pending[:, None], drafts], dim=1)
        out, feats = self.passes.verify(rows, block, lens, longest, greedy=greedy, in_order=in_order)
        if greedy:
            posterior = out
        else:
            posterior = sample_for(out.reshape(-1, out.shape[-1]), params, self.generator, repeat=k + 1,
                                   positions=positions)
            posterior = posterior.view(len(params), k + 1)
        accepted, emitted = accept(drafts, posterior, verify_n)
        self.passes.commit(rows, lens, accepted, emitted, feats, longest)
        # The one host sync of a step: how many tokens each row accepted.
        return accepted, torch.cat([accepted[:, None], verify_n[:, None], emitted], dim=1).tolist()

    # -- emission --------------------------------------------------------------------------------
    def _emit(self, seq: RunningSeq, new_ids: list[int], *, accepted: int, proposed: int) -> StepEvent:
        taken = seq.take(new_ids, accepted=accepted, proposed=proposed, eos_ids=self.target.eos_ids,
                         decode=self.target.decode)
        if seq.finish is None:
            return StepEvent(seq.request.rid, taken)
        self._leave(seq)
        output = seq.output(self.target.decode, method=self.method, drafter_version=self.drafter_version)
        if not seq.request.probe:
            self.stats["verify_ct"] += seq.verify_ct
            self.stats["completion_tokens"] += len(seq.output_ids)
            self.stats["requests"] += 1
        return StepEvent(seq.request.rid, taken, output)

    @property
    def avg_accept_length(self) -> float | None:
        if not self.stats["verify_ct"]:
            return None
        return self.stats["completion_tokens"] / self.stats["verify_ct"]


def check_request(request: Request, *, vocab: int, max_len: int, margin: int, drafts: bool) -> None:
    """What an engine of this vocabulary and context takes (`Engine.check`; a server whose engine runs in
    another process checks with the same facts, `serve/engine_process.py`); ValueError says what is wrong."""
    params = request.params
    params.validate()
    if not request.prompt_ids:
        raise ValueError("the prompt is empty")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in request.prompt_ids):
        raise ValueError(f"input_ids must be integers in [0, {vocab})")
    if len(request.prompt_ids) + params.max_new_tokens + margin > max_len:
        fits = max_len - margin - len(request.prompt_ids)
        raise ValueError(
            f"prompt ({len(request.prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
            f"exceeds the context of {max_len} tokens, {margin} of which are kept for "
            f"{'drafting and ' if drafts else ''}verifying: "
            + (f"at most {fits} new tokens fit after this prompt" if fits > 0 else "the prompt alone is too long")
        )
