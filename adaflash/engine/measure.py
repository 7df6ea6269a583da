"""Offline measurement of a method through the embedded engine (no HTTP): τ, throughput, latency.

Metric names follow SGLang's bench_serving so these records sit beside HTTP benchmark results.
"""

from __future__ import annotations

import time
from typing import Any

from adaflash.bench.metrics import TokenGaps, compute_metrics, engine_results
from adaflash.engine.engine import Engine
from adaflash.engine.params import DRAFT_MARGIN, Request, SamplingParams


def measure(engine: Engine, prompts: list[str], *, max_new_tokens: int, temperature: float = 0.0,
            top_p: float = 1.0, warmup: int = 2) -> tuple[dict[str, Any], list[Any]]:
    """Run all prompts with the engine's batch size as concurrency; returns (metrics, outputs)."""
    target = engine.target
    encoded = [target.encode(p) for p in prompts]
    if warmup:
        if engine.graphs.enabled:
            # Every decode graph the timed run can meet (batch × context × width), captured off the clock:
            # a few prompts cannot reach the larger batches and contexts, whose captures then land in the timing.
            engine.capture_graphs(max(len(ids) for ids in encoded) + max_new_tokens + DRAFT_MARGIN)
        engine.generate([Request(list(ids), SamplingParams(max_new_tokens=8)) for ids in encoded[:warmup]])
    requests = [Request(list(ids), SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p),
                        prompt_text=p) for ids, p in zip(encoded, prompts)]
    gaps = TokenGaps(time.perf_counter)
    started = time.perf_counter()
    outputs = engine.generate(requests, on_event=gaps)
    metrics = compute_metrics(engine_results(outputs, gaps.itl), time.perf_counter() - started)
    metrics.update({"max_concurrency": engine.max_batch, "concurrency": engine.max_batch, "num_prompts": len(prompts),
                    "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p})
    return metrics, outputs
