"""`GET /metrics`: the server's counters in Prometheus' text format, under SGLang's metric names.

Why SGLang's names: dashboards and alerts built for SGLang (its Grafana board, `sglang:` queries) then
work on the embedded engine unchanged. SGLang reports speculation only as gauges (τ and the accept
rate); the draft and accepted token counters, which give τ and the accept rate over any window, take
vLLM's names (`vllm:spec_decode_*`), so vLLM's queries work too. Other names without an SGLang
counterpart use the `adaflash:` prefix.
Each server has its own registry (tests run several servers in one process), and gauges are read from
the server at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# SGLang's default TTFT / latency buckets reach a few minutes; ITL buckets are finer.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0,
                20.0, 25.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08,
               0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """Counters and histograms the handlers feed, plus gauges read from `state()` when scraped."""

    def __init__(self, model_name: str, state: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model_name": model_name}
        names = ["model_name"]
        r = self.registry
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", names,
                                     registry=r).labels(**self.labels)
        self.requests = Counter("sglang:num_requests", "The number of finished requests.", names,
                                registry=r).labels(**self.labels)
        self.aborted = Counter("sglang:num_aborted_requests", "The number of requests whose client left.", names,
                               registry=r).labels(**self.labels)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              names, buckets=TTFT_BUCKETS, registry=r).labels(**self.labels)
        self.token_times = TokenTimes(ITL_BUCKETS)
        r.register(_TokenTimesCollector(self.labels, self.token_times))
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", names, buckets=E2E_BUCKETS,
                             registry=r).labels(**self.labels)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of verify steps that checked a draft.", names,
                              registry=r).labels(**self.labels)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens proposed.", names,
                                    registry=r).labels(**self.labels)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Number of draft tokens accepted.",
                                       names, registry=r).labels(**self.labels)
        self.spec_totals = {"draft_tokens": 0, "accepted_tokens": 0}
        r.register(_Gauges(self.labels, lambda: {**state(), "spec_accept_rate": self.accept_rate()}))

    def tokens(self, count: int, since_last: float | None) -> None:
        """A step's `count` new tokens of one request, `since_last` seconds after its previous ones
        (None for its first); each token counts once in the inter-token latency."""
        if count > 0:
            self.token_times.add(count, None if since_last is None else since_last / count)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def finished(self, prompt_tokens: int, e2e_seconds: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.requests.inc()
        self.e2e.observe(e2e_seconds)

    def speculated(self, meta: dict[str, Any]) -> None:
        """A finished request's drafting, from its meta_info: draft tokens proposed and accepted, and
        verify steps that checked a draft (the steps of its accept histogram)."""
        proposed = int(meta.get("spec_num_proposed_drafts") or 0)
        accepted = int(meta.get("spec_num_correct_drafts") or 0)
        drafts = sum(int(n) for n in meta.get("spec_accept_histogram") or ())
        if drafts:
            self.drafts.inc(drafts)
        if proposed:
            self.draft_tokens.inc(proposed)
            self.accepted_tokens.inc(accepted)
            self.spec_totals["draft_tokens"] += proposed
            self.spec_totals["accepted_tokens"] += accepted

    def accept_rate(self) -> float | None:
        """Draft tokens accepted per draft token proposed, so far (None before any draft)."""
        proposed = self.spec_totals["draft_tokens"]
        return self.spec_totals["accepted_tokens"] / proposed if proposed else None

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TokenTimes:
    """Tokens generated and their inter-token latencies by bucket, read at scrape time. Not a
    prometheus_client Counter and Histogram: those take a lock a call, about 2 µs a streamed chunk of one
    token and 4 of three, and a server streaming 64 answers counts 64 chunks a step, on the thread that
    shares the interpreter lock with the engine. Only the event loop's thread adds and reads them."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # by bucket, the last past every bound (+Inf)
        self.tokens = 0
        self.seconds = 0.0

    def add(self, count: int, each: float | None) -> None:
        """`count` tokens, each `each` seconds after the one before (None: the request's first tokens)."""
        self.tokens += count
        if each is not None:
            self.counts[bisect_left(self.buckets, each)] += count  # le: a gap equal to a bound falls in it
            self.seconds += each * count


class _TokenTimesCollector:
    def __init__(self, labels: dict[str, str], times: TokenTimes) -> None:
        self.labels = labels
        self.times = times

    def describe(self) -> list:
        return []

    def collect(self):
        times, values = self.times, list(self.labels.values())
        tokens = CounterMetricFamily("sglang:generation_tokens", "Number of generation tokens processed.",
                                     labels=list(self.labels))
        tokens.add_metric(values, times.tokens)
        yield tokens
        itl = HistogramMetricFamily("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                    labels=list(self.labels))
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, times.buckets), "+Inf"), times.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        itl.add_metric(values, buckets, times.seconds)
        yield itl


class _Gauges:
    """Gauges computed from the server's state at each scrape."""

    GAUGES = (
        ("sglang:num_running_reqs", "The number of running requests", "running_requests"),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue", "queue_depth"),
        ("sglang:gen_throughput", "The generate throughput (token/s)", "last_gen_throughput"),
        ("sglang:spec_accept_length", "The average acceptance length of speculative decoding",
         "avg_spec_accept_length"),
        ("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding (accepted / draft tokens)",
         "spec_accept_rate"),
        ("sglang:max_running_requests", "Maximum running requests", "max_running_requests"),
        ("sglang:context_len", "The context length", "context_length"),
        ("adaflash:drafter_version", "The version of the drafter in use (-1: none or unversioned)", "drafter_version"),
        ("adaflash:drafter_swaps", "Drafter hot swaps since the server started", "drafter_swaps"),
        ("adaflash:open_connections", "HTTP connections open now", "open_connections"),
    )

    def __init__(self, labels: dict[str, str], state: Callable[[], dict[str, Any]]) -> None:
        self.labels = labels
        self.state = state

    def describe(self) -> list:
        return []

    def collect(self):
        state = self.state()
        for name, text, key in self.GAUGES:
            family = GaugeMetricFamily(name, text, labels=list(self.labels))
            value = state.get(key)
            if value is None and key == "drafter_version":
                value = -1
            if value is not None:
                family.add_metric(list(self.labels.values()), float(value))
            yield family
