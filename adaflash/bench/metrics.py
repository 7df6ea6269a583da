"""Per-request timings → one benchmark record with SGLang `bench_serving`'s key names.

Definitions follow bench_serving so results from either client compare: TTFT is the time to the
first streamed token; ITL spreads each chunk's gap evenly over the tokens it carried (a speculative
step emits several at once); TPOT = (latency - TTFT) / (output tokens - 1); percentiles interpolate
linearly (numpy's default); std is the population standard deviation.
"""

from __future__ import annotations

import contextlib
import math
import platform
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RequestResult:
    id: str
    success: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    start: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""
    error: str | None = None
    verify_ct: int | None = None
    proposed: int | None = None
    correct: int | None = None
    by_position: list[list[int]] = field(default_factory=list)  # [reached, accepted] per drafted position


def accept_by_position(results: list[RequestResult]) -> list[float] | None:
    """Per drafted position, the share of steps that accepted it among those that reached it (verified
    it, every draft before it accepted): where a drafter's block loses its tokens."""
    reached: list[int] = []
    accepted: list[int] = []
    for r in results:
        for i, (seen, took) in enumerate(r.by_position):
            if i == len(reached):
                reached.append(0)
                accepted.append(0)
            reached[i] += seen
            accepted[i] += took
    return [a / n if n else None for a, n in zip(accepted, reached)] or None


class TokenGaps:
    """Inter-token latencies from an engine's step events, counted as `adaflash bench --base-url` counts a
    stream's: each event's gap since the request's previous event, spread over the tokens it brought (a
    speculative step brings several at once). A request's first event is its first token (TTFT)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.last: dict[str, float] = {}
        self.itl: dict[str, list[float]] = {}  # per request id

    def __call__(self, event: Any) -> None:
        if not event.new_ids:
            return
        now = self.clock()
        if event.rid in self.last:
            count = len(event.new_ids)
            self.itl.setdefault(event.rid, []).extend([(now - self.last[event.rid]) / count] * count)
        self.last[event.rid] = now


def engine_results(outputs: list[Any], itl: dict[str, list[float]] | None = None) -> list[RequestResult]:
    """The embedded engine's finished requests as the HTTP client's results, so both are summarized by
    `compute_metrics` (its meta_info carries the same counts a server reports)."""
    results = []
    for output in outputs:
        meta = output.meta_info
        results.append(RequestResult(
            id=output.rid, success=True, prompt_tokens=int(meta["prompt_tokens"]),
            output_tokens=int(meta["completion_tokens"]), ttft=float(meta["ttft"]), latency=float(meta["e2e_latency"]),
            itl=list((itl or {}).get(output.rid, [])), text=output.text, verify_ct=int(meta["spec_verify_ct"]),
            proposed=int(meta.get("spec_num_proposed_drafts") or 0), correct=int(meta.get("spec_num_correct_drafts") or 0),
            by_position=[list(pair) for pair in meta.get("spec_accept_by_position") or ()]))
    return results


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy.percentile's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(prefix: str, values_s: list[float], extra: tuple[int, ...] = ()) -> dict[str, float | None]:
    """mean/median/std/p99 (+ extra percentiles) of seconds, reported in milliseconds."""
    ms = [v * 1000.0 for v in values_s]
    out: dict[str, float | None] = {
        f"mean_{prefix}_ms": statistics.fmean(ms) if ms else None,
        f"median_{prefix}_ms": statistics.median(ms) if ms else None,
        f"std_{prefix}_ms": statistics.pstdev(ms) if ms else None,
        f"p99_{prefix}_ms": percentile(ms, 99),
    }
    for q in extra:
        out[f"p{q}_{prefix}_ms"] = percentile(ms, q)
    return out


def compute_metrics(results: list[RequestResult], duration: float) -> dict[str, Any]:
    """The throughput/latency block of a record; `accept_length` from the servers' own counts."""
    done = [r for r in results if r.success]
    total_in = sum(r.prompt_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    duration = max(duration, 1e-9)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [gap for r in done for gap in r.itl]
    metrics: dict[str, Any] = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_throughput": (total_in + total_out) / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "measured_concurrency": sum(r.latency for r in done) / duration,
    }
    metrics.update(summarize("ttft", [r.ttft for r in done]))
    metrics.update(summarize("tpot", tpots))
    metrics.update(summarize("itl", itls, (95,)))
    metrics["max_itl_ms"] = max(itls) * 1000.0 if itls else None
    metrics.update(summarize("e2e_latency", [r.latency for r in done], (90,)))
    counted = [r for r in done if r.verify_ct]
    metrics["spec_verify_ct"] = sum(r.verify_ct or 0 for r in counted) or None
    metrics["accept_length"] = (sum(r.output_tokens for r in counted) / metrics["spec_verify_ct"]
                                if counted and metrics["spec_verify_ct"] else None)
    proposed = sum(r.proposed or 0 for r in done)
    metrics["accept_rate"] = sum(r.correct or 0 for r in done) / proposed if proposed else None
    metrics["accept_by_position"] = accept_by_position(done)
    return metrics


# -- accuracy -------------------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def to_number(text: Any) -> float | None:
    """A reference or answer as a number: '1,234' → 1234.0; '#### 72' → 72.0; None when absent."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str):
        return None
    _, sep, tail = text.rpartition("####")
    return last_number(tail if sep else text)


def last_number(text: str) -> float | None:
    """The last number written in `text`, commas removed (GSM8K's answer-extraction rule)."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_correct(answer: str, reference: Any) -> bool:
    got, want = last_number(answer), to_number(reference)
    return got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-6)


def accuracy(dataset: str, answers: list[tuple[str, Any]]) -> float | None:
    """Share of correct answers where the dataset has a checkable reference (GSM8K-style numbers)."""
    checkable = [(a, ref) for a, ref in answers if to_number(ref) is not None]
    if not checkable:
        return None
    return sum(gsm8k_correct(a, ref) for a, ref in checkable) / len(checkable)


# -- hardware --------------------------------------------------------------------------------------
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def local_hardware() -> str:
    """GPU model(s) through NVML when there are GPUs, else the CPU model."""
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            names = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else str(name))
        finally:
            pynvml.nvmlShutdown()
        if names:
            return f"{len(names)}x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    return cpu_model()


def passes_since(now: dict[str, dict[str, float]], before: dict[str, dict[str, float]] | None = None
                 ) -> dict[str, dict[str, float]]:
    """An engine's passes by kind ({kind: {steps, seconds, rows}}, running totals) less those `before`: where a
    run's time went (decode or speculative steps against prefills; AdaFlash's whole-block steps against
    head-chosen ones and the cost rule's probes) and how full its passes were, in `bench engine` and through
    a server alike."""
    before = before or {}
    out = {}
    for kind, total in now.items():
        earlier = before.get(kind, {})
        steps = int(total["steps"] - earlier.get("steps", 0))
        if steps:
            out[kind] = {"steps": steps, "seconds": total["seconds"] - earlier.get("seconds", 0.0)}
            if "rows" in total:
                out[kind]["rows"] = int(total["rows"] - earlier.get("rows", 0))
    return out


def passes_text(passes: dict[str, dict[str, float]]) -> str:
    """`decode 2,032 (3.28 s, 61.2 rows a pass), prefill 16 (...)`: one line of where the time went."""
    return ", ".join(f"{kind} {int(p['steps']):,} ({p['seconds']:.2f} s"
                     + (f", {p['rows'] / p['steps']:.1f} rows a pass)" if p.get("rows") else ")")
                     for kind, p in sorted(passes.items()))


def loop_since(now: dict[str, float] | None, before: dict[str, float] | None) -> dict[str, float] | None:
    """A serving engine's loop (`LoopTimes.totals()`) over a stretch: its steps, the mean rows in the batch as
    a step began, the milliseconds a step spent inside `engine.step` and between steps while work waited."""
    if not now:
        return None
    before = before or {}
    steps = now["steps"] - before.get("steps", 0)
    if steps <= 0:
        return {"steps": 0}
    return {"steps": steps, "rows_per_step": (now["rows"] - before.get("rows", 0)) / steps,
            "step_ms": 1e3 * (now["inside_seconds"] - before.get("inside_seconds", 0.0)) / steps,
            "between_ms": 1e3 * (now["between_seconds"] - before.get("between_seconds", 0.0)) / steps}
