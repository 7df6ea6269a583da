"""The server's token counter and inter-token latency histogram read as prometheus_client's own would."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adaflash.serve.metrics import ITL_BUCKETS, ServerMetrics


def _samples(text: str, names: tuple[str, ...]) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith(names) and not s.name.endswith("_created")}


def test_tokens_and_gaps_match_a_prometheus_counter_and_histogram():
    metrics = ServerMetrics("m", dict)
    registry = CollectorRegistry()
    itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                    ["model_name"], buckets=ITL_BUCKETS, registry=registry).labels(model_name="m")
    tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.", ["model_name"],
                     registry=registry).labels(model_name="m")
    rng = random.Random(0)
    for _ in range(2000):  # chunks of 1-4 tokens, some first (no gap), some exactly on a bucket's bound
        count = rng.randint(1, 4)
        gap = rng.choice([None, rng.random() * 0.2, rng.random() * 3, ITL_BUCKETS[rng.randrange(len(ITL_BUCKETS))]])
        since_last = None if gap is None else gap * count
        metrics.tokens(count, since_last)
        tokens.inc(count)
        for _ in range(count if since_last is not None else 0):
            itl.observe(since_last / count)
    metrics.tokens(0, 0.5)  # no tokens: nothing counted
    names = ("sglang:inter_token_latency_seconds", "sglang:generation_tokens")
    ours, theirs = _samples(metrics.render().decode(), names), _samples(generate_latest(registry).decode(), names)
    assert ours.keys() == theirs.keys() and len(ours) == len(ITL_BUCKETS) + 4  # buckets, +Inf, count, sum, total
    for key, value in theirs.items():
        assert abs(ours[key] - value) <= 1e-9 * max(1.0, abs(value)), key
