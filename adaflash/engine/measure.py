"""Offline measurement of a method through the embedded engine (no HTTP): τ, throughput, latency.

Metric names follow SGLang's bench_serving so these records sit beside HTTP benchmark results.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from adaflash.bench.metrics import percentile
from adaflash.engine.engine import Engine
from adaflash.engine.params import DRAFT_MARGIN, Request, SamplingParams


def measure(engine: Engine, prompts: list[str], *, max_new_tokens: int, temperature: float = 0.0,
            warmup: int = 2) -> tuple[dict[str, Any], list[Any]]:
    """Run all prompts with the engine's batch size as concurrency; returns (metrics, outputs)."""
    target = engine.target
    encoded = [target.encode(p) for p in prompts]
    if warmup:
        if engine.graphs.enabled:
            # Every decode graph the timed run can meet (batch × context × width), captured off the clock:
            # a few prompts cannot reach the larger batches and contexts, whose captures then land in the timing.
            engine.capture_graphs(max(len(ids) for ids in encoded) + max_new_tokens + DRAFT_MARGIN)
        engine.generate([Request(list(ids), SamplingParams(max_new_tokens=8)) for ids in encoded[:warmup]])
    requests = [Request(list(ids), SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                        prompt_text=p) for ids, p in zip(encoded, prompts)]
    started = time.perf_counter()
    outputs = engine.generate(requests)
    duration = time.perf_counter() - started
    out_tokens = sum(o.meta_info["completion_tokens"] for o in outputs)
    in_tokens = sum(o.meta_info["prompt_tokens"] for o in outputs)
    verify = sum(o.meta_info["spec_verify_ct"] for o in outputs)
    proposed = sum(o.meta_info["spec_num_proposed_drafts"] for o in outputs)
    correct = sum(o.meta_info["spec_num_correct_drafts"] for o in outputs)
    e2e = [o.meta_info["e2e_latency"] * 1000 for o in outputs]
    ttft = [o.meta_info["ttft"] * 1000 for o in outputs]
    tpot = [(o.meta_info["e2e_latency"] - o.meta_info["ttft"]) * 1000 / max(o.meta_info["completion_tokens"] - 1, 1)
            for o in outputs]
    metrics = {
        "completed": len(outputs), "duration": duration, "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens, "request_throughput": len(outputs) / duration,
        "output_throughput": out_tokens / duration, "input_throughput": in_tokens / duration,
        "accept_length": out_tokens / max(verify, 1),
        "accept_rate": correct / proposed if proposed else None,
        "mean_e2e_latency_ms": statistics.mean(e2e), "median_e2e_latency_ms": statistics.median(e2e),
        "p99_e2e_latency_ms": percentile(e2e, 99), "mean_ttft_ms": statistics.mean(ttft),
        "median_ttft_ms": statistics.median(ttft), "p99_ttft_ms": percentile(ttft, 99), "mean_tpot_ms": statistics.mean(tpot),
        "median_tpot_ms": statistics.median(tpot), "p99_tpot_ms": percentile(tpot, 99),
        "max_concurrency": engine.max_batch, "concurrency": engine.max_batch, "num_prompts": len(prompts),
        "max_new_tokens": max_new_tokens, "temperature": temperature,
    }
    return metrics, outputs
