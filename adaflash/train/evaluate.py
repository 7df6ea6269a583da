"""Evaluation τ and throughput of a drafter through the real engine (greedy, a few prompts)."""

from __future__ import annotations

import copy
import time

import torch

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.methods import VANILLA, plain_method_for
from adaflash.models.drafters import Drafter
from adaflash.models.loading import Target


def eval_tau(target: Target, drafter: Drafter | None, prompts: list[str], *, method: str | None = None,
             max_new_tokens: int = 64, batch: int = 8, verify_length: int | None = None) -> dict[str, float]:
    """τ (accepted tokens per target pass), tokens/s and wall time over `prompts` (exact prompt strings);
    `verify_length`: a fixed verify width instead of the method's own."""
    method = method or (VANILLA if drafter is None else plain_method_for(drafter.method).name)
    frozen = copy.deepcopy(drafter).eval() if drafter is not None else None
    ids = [target.encode(p) for p in prompts]
    fits = max((len(i) for i in ids), default=0) + max_new_tokens + 64  # a suite has prompts past 2,048 tokens
    config = EngineConfig(max_batch=batch, max_len=max(2048, fits), verify_length=verify_length)
    engine = Engine(target, method, frozen, config=config)
    requests = [Request(i, SamplingParams(max_new_tokens=max_new_tokens)) for i in ids]
    started = time.perf_counter()
    with torch.no_grad():
        outputs = engine.generate(requests)
    elapsed = time.perf_counter() - started
    tokens = sum(o.meta_info["completion_tokens"] for o in outputs)
    verify = sum(o.meta_info["spec_verify_ct"] for o in outputs)
    return {"eval_tau": tokens / max(verify, 1), "eval_tok_s": tokens / elapsed, "eval_seconds": elapsed,
            "eval_tokens": float(tokens)}
