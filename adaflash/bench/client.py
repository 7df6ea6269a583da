"""The benchmark client: streams requests to a server under a concurrency cap, in SGLang's /generate
dialect (ours, SGLang) or the OpenAI one (/v1/completions: vLLM and any other OpenAI-compatible server).

Streaming is what makes TTFT and ITL real (a non-streamed answer only has its total latency).
A semaphore holds at most `concurrency` requests in flight, like bench_serving's --max-concurrency
with an infinite request rate. Warm-up requests run first and are not measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from adaflash.bench.metrics import (
    RequestResult,
    accuracy,
    compute_metrics,
    local_hardware,
    loop_since,
    passes_since,
)
from adaflash.bench.prompts import BenchPrompt, answer_budget
from adaflash.methods import method_for_algorithm

READ_BUFSIZE = 16 * 1024 * 1024  # a cumulative stream chunk of a long answer can be large


@dataclass
class BenchSettings:
    base_url: str
    concurrency: int = 1
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    warmup: int = 0
    stream: bool = True
    ignore_eos: bool = False
    api_key: str | None = None
    timeout: float = 6 * 3600.0
    api: str = "generate"  # or "openai"
    length_spread: float = 0.0  # each prompt's max_new_tokens by its id (`answer_budget`)
    model: str | None = None  # the OpenAI API's "model" (`bench` takes the server's first in /v1/models)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _budget(settings: BenchSettings, prompt: BenchPrompt) -> int:
    return answer_budget(prompt.id, settings.max_new_tokens, settings.length_spread)


def _payload(settings: BenchSettings, prompt: BenchPrompt) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": _budget(settings, prompt), "temperature": settings.temperature}
    if settings.top_p != 1.0:
        params["top_p"] = settings.top_p
    if settings.ignore_eos:
        params["ignore_eos"] = True
    return {"text": prompt.text, "sampling_params": params, "stream": settings.stream}


def _openai_payload(settings: BenchSettings, prompt: BenchPrompt) -> dict[str, Any]:
    """The same request as `_payload` in the OpenAI dialect; `continuous_usage_stats` asks servers that
    have it (vLLM) for the token count in every chunk, which tells a chunk's tokens apart."""
    body: dict[str, Any] = {"model": settings.model, "prompt": prompt.text, "max_tokens": _budget(settings, prompt),
                            "temperature": settings.temperature, "stream": settings.stream}
    if settings.top_p != 1.0:
        body["top_p"] = settings.top_p
    if settings.ignore_eos:
        body["ignore_eos"] = True
    if settings.stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def _apply_openai(result: RequestResult, data: dict[str, Any]) -> bool:
    """A completion (or one streamed chunk of it) into `result`: text, and token counts where given;
    whether it carried a token count."""
    for choice in data.get("choices") or []:
        result.text += choice.get("text") or ""
    usage = data.get("usage") or {}
    if isinstance(usage.get("prompt_tokens"), int):
        result.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        result.output_tokens = usage["completion_tokens"]
        return True
    return False


def _apply_meta(result: RequestResult, data: dict[str, Any]) -> None:
    meta = data.get("meta_info") or {}
    result.text = data.get("text", result.text) or ""
    if isinstance(meta.get("completion_tokens"), int):
        result.output_tokens = meta["completion_tokens"]
    if isinstance(meta.get("prompt_tokens"), int):
        result.prompt_tokens = meta["prompt_tokens"]
    if isinstance(meta.get("spec_verify_ct"), int):
        result.verify_ct = meta["spec_verify_ct"]
    if isinstance(meta.get("spec_num_proposed_drafts"), int):
        result.proposed = meta["spec_num_proposed_drafts"]
        result.correct = meta.get("spec_num_correct_drafts") or 0
    by_position = meta.get("spec_accept_by_position")
    if isinstance(by_position, list) and all(isinstance(p, list) and len(p) == 2 for p in by_position):
        result.by_position = [[int(n) for n in pair] for pair in by_position]


_META = '"meta_info":'
_DECODER = json.JSONDecoder()


def _native_chunk(chunk: bytes) -> dict[str, Any]:
    """A native stream's chunk, decoded only as far as a partial one needs: its meta_info (the token count),
    not the text and ids so far, which every chunk repeats in full. Why: whole decodes took a quarter of the
    client's event loop at 64 streams of 256 tokens, a share that grows with the answers, and a client slow
    to read makes the server look slow. A last chunk, an error, or one without a count is decoded whole."""
    text = chunk.decode()
    at = text.rfind(_META)
    if at >= 0:
        start = at + len(_META)
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        try:
            meta, _ = _DECODER.raw_decode(text, start)
        except ValueError:
            meta = None
        if isinstance(meta, dict) and meta.get("finish_reason") is None and isinstance(meta.get("completion_tokens"), int):
            return {"meta_info": meta}
    return json.loads(text)


async def send_request(session: aiohttp.ClientSession, settings: BenchSettings, prompt: BenchPrompt) -> RequestResult:
    """One request; never raises: a failure is a RequestResult with `error` set."""
    result = RequestResult(prompt.id)
    start = result.start = time.perf_counter()
    last_at, last_tokens = start, 0
    openai = settings.api == "openai"
    url, body = (settings.base_url + "/v1/completions", _openai_payload(settings, prompt)) if openai \
        else (settings.base_url + "/generate", _payload(settings, prompt))
    try:
        async with session.post(url, json=body, headers=settings.headers) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:500]}"
                return result
            if not settings.stream:
                data = await response.json(content_type=None)
                if openai:
                    _apply_openai(result, data)
                else:
                    _apply_meta(result, data)
                result.latency = result.ttft = time.perf_counter() - start
                result.success = True
                return result
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                chunk = line[5:].strip()
                if chunk == b"[DONE]":
                    break
                data = json.loads(chunk) if openai else _native_chunk(chunk)
                if "error" in data:
                    error = data["error"]
                    result.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
                    return result
                now = time.perf_counter()
                before = result.output_tokens
                if openai:  # without a count, a chunk with text stands for one token
                    counted = _apply_openai(result, data)
                    shown = any(c.get("text") for c in data.get("choices") or [])
                    if not counted and not shown:
                        continue  # a role or usage-only chunk: no token arrived
                else:
                    _apply_meta(result, data)
                    counted, shown = "completion_tokens" in (data.get("meta_info") or {}), bool(data.get("text"))
                tokens = result.output_tokens if counted else before + (1 if shown else 0)
                result.output_tokens = max(tokens, result.output_tokens)
                if result.ttft == 0.0:
                    if result.output_tokens > 0:
                        result.ttft = now - start
                        last_at, last_tokens = now, result.output_tokens
                    continue
                new = result.output_tokens - last_tokens
                if new > 0:
                    result.itl.extend([(now - last_at) / new] * new)
                    last_at, last_tokens = now, result.output_tokens
            result.latency = time.perf_counter() - start
            result.success = result.error is None
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as err:
        result.error = f"{type(err).__name__}: {err}"
    return result


async def fetch_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    try:
        async with session.get(url, headers=headers) as response:
            if response.status != 200:
                return None
            data = await response.json(content_type=None)
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def run_requests(settings: BenchSettings, prompts: list[BenchPrompt],
                       on_done: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float, dict]:
    """(results in prompt order, measured duration, server info before the run)."""
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    connector = aiohttp.TCPConnector(limit=max(settings.concurrency, 1) + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=READ_BUFSIZE) as session:
        about = settings.base_url + info_path(settings.api)
        info = server_info(await fetch_json(session, about, settings.headers), settings.api)
        semaphore = asyncio.Semaphore(settings.concurrency)

        async def limited(prompt: BenchPrompt, report: bool) -> RequestResult:
            async with semaphore:
                result = await send_request(session, settings, prompt)
            if report and on_done:
                on_done(result)
            return result

        start = info
        if settings.warmup and prompts:
            warm = [prompts[i % len(prompts)] for i in range(settings.warmup)]
            await asyncio.gather(*(limited(p, False) for p in warm))
            start = server_info(await fetch_json(session, about, settings.headers), settings.api)
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(p, True) for p in prompts))
        duration = time.perf_counter() - started
        after = server_info(await fetch_json(session, about, settings.headers), settings.api)
    if after:
        info = {**info, **after}
        if "engine_passes" in after:  # ours: the engine's passes during the measured requests, and its loop
            info["passes"] = passes_since(after["engine_passes"], start.get("engine_passes"))
            info["engine_loop"] = loop_since(after.get("engine_loop"), start.get("engine_loop"))
    return list(results), duration, info


def info_path(api: str) -> str:
    """Where a server of the dialect says what it serves (`server_info` reads the answer)."""
    return "/get_server_info" if api == "generate" else "/v1/models"


def server_info(data: dict[str, Any] | None, api: str) -> dict[str, Any]:
    """What a server says of itself: /get_server_info as it is, or from an OpenAI server's /v1/models
    the model it serves (its first), as `model_path`."""
    if not data:
        return {}
    if api == "generate":
        return data
    ids = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict) and m.get("id")]
    return {"model_path": ids[0]} if ids else {}


def server_accept_length(info: dict[str, Any]) -> float | None:
    value = info.get("avg_spec_accept_length")
    if value is None:
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            value = states[0].get("avg_spec_accept_length")
    return float(value) if isinstance(value, (int, float)) else None


def method_from_info(info: dict[str, Any]) -> str | None:
    if info.get("method"):
        return str(info["method"])
    if "speculative_algorithm" not in info:  # no server info (an OpenAI-only server): not ours to guess
        return None
    algorithm = info.get("speculative_algorithm")
    method = method_for_algorithm(None if algorithm is None else str(algorithm))
    return method.name if method else str(algorithm).lower()


def build_record(
    settings: BenchSettings,
    prompts: list[BenchPrompt],
    results: list[RequestResult],
    duration: float,
    info: dict[str, Any],
    *,
    dataset: str,
    method: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    label: str | None = None,
    eval_accuracy: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One benchmark record: SGLang's metric names plus what makes rows comparable."""
    metrics = compute_metrics(results, duration)
    if metrics["accept_length"] is None:
        metrics["accept_length"] = server_accept_length(info)
    acc = None
    if eval_accuracy:
        by_id = {p.id: p for p in prompts}
        acc = accuracy(dataset, [(r.text, by_id[r.id].reference) for r in results if r.success and r.id in by_id])
    errors = [r.error for r in results if r.error][:5]
    record = {
        "method": method or method_from_info(info),
        "target": target or info.get("target") or info.get("model_path"),
        "draft": draft if draft is not None else (info.get("draft") or info.get("speculative_draft_model_path")),
        "dataset": dataset,
        "concurrency": settings.concurrency,
        "max_concurrency": settings.concurrency,
        "num_prompts": len(prompts),
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_new_tokens": settings.max_new_tokens,
        "length_spread": settings.length_spread,
        "warmup": settings.warmup,
        "stream": settings.stream,
        "label": label,
        "tag": label,
        "accuracy": acc,
        "hardware": info.get("hardware") or local_hardware(),
        "backend": "adaflash-embedded" if info.get("engine") == "embedded" else "sglang" if settings.api == "generate"
        else "openai",
        "api": settings.api,
        "base_url": settings.base_url,
        "drafter_version": info.get("drafter_version"),
        "server_accept_length": server_accept_length(info),
        "passes": info.get("passes"),  # our server's engine passes by kind during the measured requests
        "engine_loop": info.get("engine_loop"),  # and its loop: steps, rows a step, time inside and between steps
        **metrics,
        "errors": errors,
    }
    record.update(extra or {})
    return record


def run_benchmark(settings: BenchSettings, prompts: list[BenchPrompt], *, dataset: str,
                  on_done: Callable[[RequestResult], None] | None = None, **record_kw: Any) -> dict[str, Any]:
    """Run the prompts and return the record (synchronous wrapper for the CLI and the matrix)."""
    results, duration, info = asyncio.run(run_requests(settings, prompts, on_done))
    return build_record(settings, prompts, results, duration, info, dataset=dataset, **record_kw)
