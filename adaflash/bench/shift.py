"""`bench shift`: replay a traffic shift against one adapting server and follow τ through it.

Each phase sends its domain's prompts (tagged with the phase's name) for a fixed time at a fixed
concurrency. A few prompts of each phase are held out: they are sent in rounds with `"adapt": false`,
so the server never trains on them, and their τ is what the drafter learned about the domain rather
than about the prompts it saw. Every held-out prompt is answered greedily in every round, across
drafter versions, so its answers must all be identical (the engine is lossless); a difference is
reported as a failure. The server's drafter version is polled once a second to place the swaps.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import cycle
from typing import Any

import aiohttp

from adaflash.bench.metrics import percentile
from adaflash.bench.prompts import BenchPrompt


@dataclass
class Phase:
    name: str
    traffic: list[BenchPrompt]
    holdout: list[BenchPrompt]
    seconds: float = 300.0


@dataclass
class ShiftSettings:
    base_url: str
    concurrency: int = 4
    max_new_tokens: int = 256
    probe_every: float = 30.0  # seconds between two rounds of held-out prompts
    api_key: str | None = None


@dataclass
class Sample:
    phase: str
    holdout: bool
    prompt_id: str
    start: float  # seconds since the replay began
    end: float
    tokens: int = 0
    verify: int = 0
    version: int | None = None
    digest: str = ""  # of the answer's token ids
    error: str | None = None


@dataclass
class ShiftResult:
    samples: list[Sample] = field(default_factory=list)
    switches: list[tuple[float, str]] = field(default_factory=list)  # (time, phase that begins)
    swaps: list[tuple[float, int]] = field(default_factory=list)  # (time the version was first seen, version)

    def as_json(self) -> dict[str, Any]:
        return {"samples": [asdict(s) for s in self.samples], "switches": self.switches, "swaps": self.swaps,
                "summary": summarize(self)}


async def replay(settings: ShiftSettings, phases: list[Phase], *,
                 on_sample: Callable[[Sample], None] | None = None,
                 on_switch: Callable[[str], None] | None = None) -> ShiftResult:
    """Send each phase's traffic for its `seconds`, its held-out rounds every `probe_every` seconds;
    `on_sample` sees each finished request, `on_switch` each phase as it begins (a live run log)."""
    result = ShiftResult()

    def keep(sample: Sample) -> None:
        result.samples.append(sample)
        if on_sample:
            on_sample(sample)

    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    began = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - began

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        poller = asyncio.create_task(_poll_versions(session, settings.base_url, clock, result))
        try:
            for phase in phases:
                result.switches.append((clock(), phase.name))
                if on_switch:
                    on_switch(phase.name)
                end = clock() + phase.seconds
                prompts = cycle(phase.traffic)

                async def traffic(phase: Phase = phase, end: float = end, prompts=prompts) -> None:
                    while clock() < end:
                        keep(await _send(session, settings, phase.name, next(prompts), False, clock))

                async def probes(phase: Phase = phase, end: float = end) -> None:
                    while phase.holdout:
                        round_ = [_send(session, settings, phase.name, p, True, clock) for p in phase.holdout]
                        for sample in await asyncio.gather(*round_):
                            keep(sample)
                        wait = min(settings.probe_every, end - clock())
                        if wait <= 0:
                            return
                        await asyncio.sleep(wait)

                await asyncio.gather(*(traffic() for _ in range(settings.concurrency)), probes())
        finally:
            poller.cancel()
    return result


async def _send(session: aiohttp.ClientSession, settings: ShiftSettings, phase: str, prompt: BenchPrompt,
                holdout: bool, clock) -> Sample:
    body = {"text": prompt.text, "tag": phase, "adapt": not holdout,
            "sampling_params": {"max_new_tokens": settings.max_new_tokens, "temperature": 0}}
    sample = Sample(phase, holdout, prompt.id, clock(), 0.0)
    try:
        async with session.post(settings.base_url + "/generate", json=body) as response:
            data = await response.json(content_type=None)
            if response.status != 200:
                sample.error = f"HTTP {response.status}: {str(data)[:300]}"
            else:
                meta = data.get("meta_info") or {}
                sample.tokens = int(meta.get("completion_tokens") or 0)
                sample.verify = int(meta.get("spec_verify_ct") or 0)
                sample.version = meta.get("drafter_version")
                sample.digest = hashlib.sha256(str(data.get("output_ids")).encode()).hexdigest()[:16]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        sample.error = f"{type(err).__name__}: {err}"
    sample.end = clock()
    return sample


async def _poll_versions(session: aiohttp.ClientSession, url: str, clock, result: ShiftResult) -> None:
    last = None
    while True:
        try:
            async with session.get(url + "/get_server_info") as response:
                info = await response.json(content_type=None)
            version = info.get("drafter_version")
            if version != last and version is not None:
                result.swaps.append((clock(), int(version)))
                last = version
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass  # a busy moment: the next poll places the swap
        await asyncio.sleep(1.0)


def tau(samples: list[Sample]) -> float | None:
    verify = sum(s.verify for s in samples)
    return sum(s.tokens for s in samples) / verify if verify else None


def probe_rounds(samples: list[Sample], phase: str) -> list[tuple[float, float | None]]:
    """(time, τ) of each round of a phase's held-out prompts (a round: the samples sent together)."""
    rounds: dict[float, list[Sample]] = {}
    for s in samples:
        if s.holdout and s.phase == phase and s.error is None:
            rounds.setdefault(round(s.start, 1), []).append(s)
    return [(t, tau(group)) for t, group in sorted(rounds.items())]


def summarize(result: ShiftResult) -> dict[str, Any]:
    """Per phase: τ of the traffic and of the held-out rounds (first, last, best and when, mean of the last
    quarter of rounds: one round is only a few prompts); latency percentiles of the
    requests that ended before the first swap, of those in flight during a swap, and of the others after
    it; and whether every held-out answer stayed the same."""
    swaps = [t for t, _ in result.swaps[1:]]  # the first poll is the starting version, not a swap
    ok = [s for s in result.samples if s.error is None]

    def swapped(s: Sample) -> bool:
        return any(s.start <= t <= s.end for t in swaps)

    phases = {}
    for began, name in result.switches:
        traffic = [s for s in ok if s.phase == name and not s.holdout]
        rounds = [(t, value) for t, value in probe_rounds(ok, name) if value is not None]
        tenth = max(len(traffic) // 10, 1)
        best = max(rounds, key=lambda r: r[1], default=None)
        quarter = [value for _, value in rounds[-max(len(rounds) // 4, 1):]]
        phases[name] = {
            "requests": len(traffic), "tau": tau(traffic), "tau_first_tenth": tau(traffic[:tenth]),
            "tau_last_tenth": tau(traffic[-tenth:]),
            "holdout_tau_first": rounds[0][1] if rounds else None, "holdout_tau_last": rounds[-1][1] if rounds else None,
            "holdout_tau_best": best[1] if best else None, "holdout_best_after_s": best[0] - began if best else None,
            "holdout_tau_last_quarter": sum(quarter) / len(quarter) if quarter else None,
            "holdout_rounds": len(rounds),
        }
    first = swaps[0] if swaps else float("inf")
    groups = {"before_swaps": [s for s in ok if s.end < first], "during_swap": [s for s in ok if swapped(s)],
              "after_swaps": [s for s in ok if s.start > first and not swapped(s)]}
    latency = {}
    for label, group in groups.items():
        seconds = [s.end - s.start for s in group]
        latency[label] = {"requests": len(seconds), "p50": percentile(seconds, 50), "p99": percentile(seconds, 99)}
    answers: dict[str, set[str]] = {}
    for s in ok:
        if s.holdout:
            answers.setdefault(f"{s.phase}/{s.prompt_id}", set()).add(s.digest)
    changed = sorted(k for k, digests in answers.items() if len(digests) > 1)
    return {"phases": phases, "latency": latency, "swaps": len(swaps), "errors": len(result.samples) - len(ok),
            "holdout_prompts": len(answers), "holdout_answers_changed": changed}
