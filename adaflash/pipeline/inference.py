"""The inference worker: answers prompts with target + current drafter, streams trajectories.

It keeps the engine full (continuous batching), appends finished trajectories to the swap
buffer, checks the weights pointer between engine steps and hot-swaps the drafter without
dropping in-flight requests. A torn or invalid version is refused, logged, and not retried.

What it records per flush (every `flush_every` finished requests, never per token): τ and
tokens/s of the window (with its raw tokens and seconds, so reports can re-aggregate over any
time span), buffer depth and drafter version; and per drafter version served in the window, the
requests, their τ sum, tokens and verify steps (`served_*`, step = the version). Each hot swap
records `swapped_version` (its time is the swap time) with the load time and the lag since the
trainer published it. A request is credited to the version that finished it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adaflash.data.prompts import read_prompt_file
from adaflash.engine.engine import Engine
from adaflash.engine.params import DEFAULT_LENGTH_POLICY, Request, SamplingParams
from adaflash.models.drafter_io import DrafterError, load_drafter
from adaflash.models.loading import load_target
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog


@dataclass
class InferenceConfig:
    target: str
    draft: str
    data: str
    swap_dir: str
    run_id: str
    workspace: str
    method: str = "adaflash"
    batch_size: int = 16
    max_new_tokens: int = 256
    temperature: float = 0.0
    length_policy: str = DEFAULT_LENGTH_POLICY  # AdaFlash's verify length: rate or cost (engine/length_policy.py)
    max_samples: int | None = None
    skip: int = 0  # leading prompts left out (the ones the offline drafter was trained on)
    loop: bool = False
    duration: float | None = None  # seconds after this worker starts: stop taking prompts
    deadline: float | None = None  # wall clock (time.time()): stop taking prompts (the run's time budget)
    flush_every: int = 8
    chat: bool = True
    device: str | None = None
    dtype: str | None = None
    seed: int = 0


def run_inference(cfg: InferenceConfig) -> int:
    log = RunLog.open(cfg.workspace)
    buffer, store = SwapBuffer(cfg.swap_dir), WeightStore(cfg.swap_dir)
    produced = buffer.repair()
    target = load_target(cfg.target, device=cfg.device, dtype=cfg.dtype)
    version = store.latest_version()
    try:
        loaded = store.load(target.model.cfg) if version else None
    except DrafterError as err:
        log.log_event(cfg.run_id, f"refused version {version}: {err}", level="warning", job="inference")
        loaded = None
    drafter = loaded[1] if loaded else load_drafter(cfg.draft, target.model.cfg)
    version = loaded[0] if loaded else 0
    method = cfg.method if getattr(drafter, "length_head", None) is not None or cfg.method != "adaflash" else "dflash"
    engine = Engine(target, method, drafter, max_batch=cfg.batch_size, seed=cfg.seed,
                    max_len=min(target.max_context, 4096), length_policy=cfg.length_policy)
    engine.drafter_version = version
    prompts = [(row.id, target.render(row.prompt, chat=cfg.chat)) for row in read_prompt_file(cfg.data)][cfg.skip:]
    if not prompts:
        raise ValueError(f"{cfg.data}: no prompts left after --skip {cfg.skip}")
    total = cfg.max_samples or (None if cfg.loop else len(prompts))
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    next_prompt = produced  # resume: the buffer already holds the first `produced` answers
    refused: set[int] = set()
    pending_rows: list[dict] = []
    started = time.time()
    window_tokens, window_verify, window_start = 0, 0, time.perf_counter()

    def flush() -> None:
        nonlocal produced, window_tokens, window_verify, window_start
        served: dict[int, list[float]] = {}
        for row in pending_rows:
            acc = served.setdefault(int(row["drafter_version"] or 0), [0, 0.0, 0, 0])
            acc[0] += 1
            acc[1] += row["tau"]
            acc[2] += row["completion_tokens"]
            acc[3] += row["spec_verify_ct"]
        if pending_rows:
            produced = buffer.append(pending_rows)
            pending_rows.clear()
        elapsed = max(time.perf_counter() - window_start, 1e-9)
        pointer = store.pointer() or {}
        log.log_metrics(cfg.run_id, {
            "tau": window_tokens / window_verify if window_verify else None,
            "tokens_per_s": window_tokens / elapsed,
            "window_tokens": window_tokens,
            "window_seconds": elapsed,
            "buffer_depth": produced - int(pointer.get("consumed", 0)),
            "samples": produced,
            "drafter_version": engine.drafter_version or 0,
        }, step=produced, job="inference")
        for version, (n, tau_sum, tokens, verify) in sorted(served.items()):
            log.log_metrics(cfg.run_id, {"served_requests": n, "served_tau_sum": tau_sum, "served_tokens": tokens,
                                         "served_verify": verify}, step=version, job="inference")
        window_tokens, window_verify, window_start = 0, 0, time.perf_counter()

    def out_of_time() -> bool:
        now = time.time()
        return ((cfg.duration is not None and now - started >= cfg.duration)
                or (cfg.deadline is not None and now >= cfg.deadline))

    while True:
        stopping = buffer.stop_requested() or out_of_time()
        while (not stopping and len(engine.active) + len(engine.waiting) < cfg.batch_size
               and (total is None or next_prompt < total)):
            rid, text = prompts[next_prompt % len(prompts)]
            engine.add(Request(target.encode(text), params, prompt_text=text, rid=f"{rid}#{next_prompt}"))
            next_prompt += 1
        if not engine.has_work():
            break
        for event in engine.step():
            if event.output is None:
                continue
            meta = event.output.meta_info
            window_tokens += meta["completion_tokens"]
            window_verify += meta["spec_verify_ct"]
            pending_rows.append({
                "id": event.rid, "prompt_text": event.output.prompt_text, "response": event.output.text,
                "output_ids": event.output.output_ids, "finish_reason": meta["finish_reason"],
                "drafter_version": meta["drafter_version"], "tau": meta["spec_accept_length"],
                "completion_tokens": meta["completion_tokens"], "spec_verify_ct": meta["spec_verify_ct"],
            })
        if len(pending_rows) >= cfg.flush_every:
            flush()
        latest = store.latest_version()
        if latest > (engine.drafter_version or 0) and latest not in refused:
            try:
                asked = time.time()
                pointer = store.pointer() or {}
                loaded = store.load(target.model.cfg, newer_than=engine.drafter_version or 0)
                if loaded:
                    engine.swap_drafter(loaded[1], loaded[0])
                    swapped = time.time()
                    published = pointer.get("published_at") if pointer.get("version") == loaded[0] else None
                    log.log_metrics(cfg.run_id, {
                        "swapped_version": loaded[0], "swap_load_seconds": swapped - asked,
                        "swap_lag_seconds": swapped - float(published) if published else None,
                    }, step=produced, job="inference")
                    log.log_event(cfg.run_id, f"hot-swapped drafter v{loaded[0]} "
                                  f"({len(engine.active)} requests in flight)", job="inference")
            except (DrafterError, ValueError) as err:
                refused.add(latest)
                log.log_event(cfg.run_id, f"refused version {latest}: {err}", level="warning", job="inference")
    flush()
    buffer.mark_done()
    log.log_event(cfg.run_id, f"inference done: {produced} trajectories", job="inference")
    return produced
