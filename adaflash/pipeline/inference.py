"""The inference worker: answers prompts with target + current drafter, streams trajectories.

It keeps the engine full (continuous batching), appends finished trajectories to the swap
buffer, checks the weights pointer between engine steps and hot-swaps the drafter without
dropping in-flight requests. A torn or invalid version is refused, logged, and not retried.

What it records per flush (every `flush_every` finished requests, never per token; the first answer
is flushed at once, so τ is in the run log, `tau_per_version` and the Monitor from the first answer,
not `flush_every` answers later): τ and
tokens/s of the window (with its raw tokens and seconds, so reports can re-aggregate over any
time span), buffer depth and drafter version; and per drafter version served in the window, the
requests, their τ sum, tokens and verify steps (`served_*`, step = the version). Each hot swap
records `swapped_version` (its time is the swap time) with the load time and the lag since the
trainer published it. A request is credited to the version that finished it. At most once a
second it also records progress (`prompts_in_flight`, `tokens_so_far`, `answers_so_far`), so a
dashboard shows the work from the first step, long before a first flush on a CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from adaflash.data.prompts import read_prompt_file
from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.models.drafter_io import DrafterError, load_drafter
from adaflash.models.loading import load_target
from adaflash.models.memory import peak_memory_gib
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog

PROGRESS_SECONDS = 1.0  # between two progress records
MAX_SKIP_EVENTS = 5  # skipped prompts named in the run log; later ones are only counted


def answers_in_all(max_samples: int | None, loop: bool, prompts: int) -> int | None:
    """How many answers the worker writes (None: until stopped). Without --loop each prompt is answered
    once, whatever --max-samples says (a larger one used to cycle through the prompts again)."""
    limits = [n for n in (max_samples, None if loop else prompts) if n]
    return min(limits) if limits else None


@dataclass
class InferenceConfig:
    target: str
    draft: str
    data: str
    swap_dir: str
    run_id: str
    workspace: str
    method: str = "adaflash"
    engine: EngineConfig = field(default_factory=EngineConfig)  # max_batch: prompts answered at once
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    max_samples: int | None = None
    skip: int = 0  # leading prompts left out (the ones the offline drafter was trained on)
    loop: bool = False
    duration: float | None = None  # seconds after this worker starts: stop taking prompts
    deadline: float | None = None  # wall clock (time.time()): stop taking prompts (the run's time budget)
    flush_every: int = 8
    chat: bool = True
    device: str | None = None
    dtype: str = "bf16-if-native"  # as the decoding commands: bf16 on a GPU and on a CPU with a bf16 unit

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InferenceConfig:
        """The config the launcher sent as JSON (`asdict`)."""
        return cls(**{**raw, "engine": EngineConfig.from_json(raw.get("engine") or {})})


def run_inference(cfg: InferenceConfig) -> int:
    """Answer prompts until the data, the sample budget or the time runs out; returns the buffer's rows."""
    return InferenceWorker(cfg).run()


class InferenceWorker:
    """One engine kept full of prompts; finished answers go to the buffer, new versions into the engine."""

    def __init__(self, cfg: InferenceConfig) -> None:
        self.cfg = cfg
        self.log = RunLog.open(cfg.workspace)
        self.buffer, self.store = SwapBuffer(cfg.swap_dir), WeightStore(cfg.swap_dir)
        self.refused: set[int] = set()
        self.produced = self.buffer.repair()  # a restart resumes after the answers already buffered
        self.target = load_target(cfg.target, device=cfg.device, dtype=cfg.dtype)
        self.engine = self._engine()
        self.prompts = [(row.id, self.target.render(row.prompt, chat=cfg.chat))
                        for row in read_prompt_file(cfg.data)][cfg.skip:]
        if not self.prompts:
            raise ValueError(f"{cfg.data}: no prompts left after --skip {cfg.skip}")
        self.total = answers_in_all(cfg.max_samples, cfg.loop, len(self.prompts))
        self.params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        self.next_prompt = self.produced
        self.skipped = 0  # prompts the engine refused
        self.misses = 0  # refused in a row: as many as there are prompts means none fits
        self.pending: list[dict] = []
        self.started = time.time()
        self.window_tokens, self.window_verify, self.window_start = 0, 0, time.perf_counter()
        self.tokens_so_far, self.progress_at = 0, -math.inf
        self.flushed = False  # an answer of this process is in the run log: the first waits for no window

    def _engine(self) -> Engine:
        """The engine with the newest published version that passes its checksums and loads, else the
        initial drafter; each newer version it skipped is named (and never retried)."""
        cfg = self.cfg
        loaded, skipped = self.store.newest_valid(target=self.target.model.cfg)
        for version, why in skipped:
            self.refused.add(version)
            self._event(f"refused version {version}: {why}", level="warning")
        drafter = loaded[1] if loaded else load_drafter(cfg.draft, self.target.model.cfg)
        engine = Engine(self.target, cfg.method, drafter, config=cfg.engine)
        engine.drafter_version = loaded[0] if loaded else 0
        return engine

    def run(self) -> int:
        while True:
            if not (self.buffer.stop_requested() or self._out_of_time()):
                self._admit()
            if not self.engine.has_work():
                break
            self._progress()
            self._collect(self.engine.step())
            if len(self.pending) >= self.cfg.flush_every or (self.pending and not self.flushed):
                self._flush()
            self._maybe_swap()
        self._flush()
        self.buffer.mark_done()
        self._event(f"inference done: {self.produced} trajectories")
        return self.produced

    def _out_of_time(self) -> bool:
        now = time.time()
        return ((self.cfg.duration is not None and now - self.started >= self.cfg.duration)
                or (self.cfg.deadline is not None and now >= self.cfg.deadline))

    def _admit(self) -> None:
        """Top the engine up to the batch size, cycling over the prompts (ids carry the sample number). A
        prompt the engine refuses (too long for its context with --max-new-tokens) is skipped and counted:
        one long conversation in a corpus must not stop the run."""
        engine = self.engine
        while (len(engine.active) + len(engine.waiting) < engine.max_batch
               and (self.total is None or self.next_prompt < self.total)):
            sample = self.next_prompt
            rid, text = self.prompts[sample % len(self.prompts)]
            self.next_prompt += 1
            try:
                engine.add(Request(self.target.encode(text), self.params, prompt_text=text, rid=f"{rid}#{sample}"))
            except ValueError as err:
                self._skip(rid, err)
                continue
            self.misses = 0

    def _skip(self, rid: str, err: ValueError) -> None:
        self.skipped += 1
        self.misses += 1
        if self.misses >= len(self.prompts):
            raise ValueError(f"{self.cfg.data}: the engine refuses every prompt ({err})") from None
        if self.skipped <= MAX_SKIP_EVENTS:
            self._event(f"skipped prompt {rid}: {err}" + (" (further skips are only counted)"
                                                           if self.skipped == MAX_SKIP_EVENTS else ""),
                        level="warning")
        self.log.log_metrics(self.cfg.run_id, {"skipped_prompts": self.skipped}, step=self.produced,
                             job="inference")

    def _progress(self) -> None:
        """At most once a second, what is under way: a first flush may be minutes away on a CPU."""
        now = time.monotonic()
        if now - self.progress_at < PROGRESS_SECONDS:
            return
        self.progress_at = now
        self.log.log_metrics(self.cfg.run_id, {
            "prompts_in_flight": len(self.engine.active) + len(self.engine.waiting),
            "tokens_so_far": self.tokens_so_far, "answers_so_far": self.produced + len(self.pending),
        }, step=self.produced, job="inference")

    def _collect(self, events) -> None:
        for event in events:
            self.tokens_so_far += len(event.new_ids)
            if event.output is None:
                continue
            meta = event.output.meta_info
            self.window_tokens += meta["completion_tokens"]
            self.window_verify += meta["spec_verify_ct"]
            self.pending.append({
                "id": event.rid, "prompt_text": event.output.prompt_text, "response": event.output.text,
                "prompt_ids": event.output.prompt_ids, "output_ids": event.output.output_ids,
                "finish_reason": meta["finish_reason"],
                "drafter_version": meta["drafter_version"], "tau": meta["spec_accept_length"],
                "completion_tokens": meta["completion_tokens"], "spec_verify_ct": meta["spec_verify_ct"],
            })

    def _flush(self) -> None:
        """Append the finished answers to the buffer and record the window's τ, speed and depth."""
        served: dict[int, list[float]] = {}
        for row in self.pending:
            acc = served.setdefault(int(row["drafter_version"] or 0), [0, 0.0, 0, 0])
            acc[0] += 1
            acc[1] += row["tau"]
            acc[2] += row["completion_tokens"]
            acc[3] += row["spec_verify_ct"]
        if self.pending:
            self.produced = self.buffer.append(self.pending)
            self.pending.clear()
            self.flushed = True
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        consumed = int((self.store.pointer() or {}).get("consumed", 0))
        self.log.log_metrics(self.cfg.run_id, {
            "tau": self.window_tokens / self.window_verify if self.window_verify else None,
            "tokens_per_s": self.window_tokens / elapsed if self.window_tokens else None,  # the last flush may be empty
            "window_tokens": self.window_tokens,
            "window_seconds": elapsed,
            "buffer_depth": self.produced - consumed,
            "samples": self.produced,
            "drafter_version": self.engine.drafter_version or 0,
            **({} if (peak := peak_memory_gib(self.engine.device)) is None else {"peak_memory_gib": peak}),
        }, step=self.produced, version=self.engine.drafter_version or 0, job="inference")
        for version, (n, tau_sum, tokens, verify) in sorted(served.items()):
            self.log.log_metrics(self.cfg.run_id, {"served_requests": n, "served_tau_sum": tau_sum,
                                                   "served_tokens": tokens, "served_verify": verify},
                                 version=version, job="inference")
        self.window_tokens, self.window_verify, self.window_start = 0, 0, time.perf_counter()

    def _maybe_swap(self) -> None:
        """Hot-swap a newer published version between steps; a version that fails to load is never retried."""
        current = self.engine.drafter_version or 0
        latest = self.store.latest_version()
        if latest <= current or latest in self.refused:
            return
        asked = time.time()
        pointer = self.store.pointer() or {}
        try:
            loaded = self.store.load(self.target.model.cfg, newer_than=current)
            if loaded:
                self.engine.swap_drafter(loaded[1], loaded[0])  # refuses a drafter of another kind or layers
        except (DrafterError, ValueError) as err:
            self.refused.add(latest)
            self._event(f"refused version {latest}: {err}", level="warning")
            return
        if not loaded:
            return
        version = loaded[0]
        swapped = time.time()
        published = pointer.get("published_at") if pointer.get("version") == version else None
        self.log.log_metrics(self.cfg.run_id, {
            "swapped_version": version, "swap_load_seconds": swapped - asked,
            "swap_lag_seconds": swapped - float(published) if published else None,
        }, step=self.produced, version=version, job="inference")
        self._event(f"hot-swapped drafter v{version} ({len(self.engine.active)} requests in flight)")

    def _event(self, message: str, level: str = "info") -> None:
        print(f"adaflash inference worker: {message}", flush=True)
        self.log.log_event(self.cfg.run_id, message, level=level, job="inference")
