"""The embedded engine behind an HTTP server that speaks SGLang's native dialect.

Why this shape: the engine is not thread-safe and batches best when it sees every live request, so
ONE engine thread owns it (`engine_loop.EngineLoop`) and loops "take new requests → engine.step() →
hand out StepEvents"; `adaflash serve` runs that loop in a process of its own (`engine_process`), so the
streams' work here never holds the engine's interpreter lock.
The aiohttp handlers only parse, validate (the same checks `Engine.add` makes, run before queuing, so
a bad request is a 400 and never reaches the engine thread) and wait on a per-request mailbox
that the engine thread feeds through `loop.call_soon_threadsafe`. Requests from many clients are
therefore decoded in one batch. Work that must touch the engine (a drafter hot swap) is posted to the
same thread and runs between two steps.

Endpoints: POST /generate, GET /health, GET /health_generate, GET /get_server_info,
GET /get_model_info, POST /update_weights_from_disk (swaps the DRAFTER, the part the pipeline
retrains), POST /flush_cache, GET /metrics (`metrics`), GET /version; and in OpenAI's dialect
GET /v1/models[/{id}], POST /v1/completions, POST /v1/chat/completions (`openai_api`) and
POST /v1/tokenize, /v1/detokenize (`tokenize`); with --adapt, GET /adapt and POST /adapt/rollback
(`adapt`). docs/http-api.md describes them all.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hmac
import json
import re
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from adaflash.bench.metrics import cpu_model
from adaflash.engine.detokenize import TextSoFar
from adaflash.engine.engine import Engine, StepEvent
from adaflash.engine.params import Output, Request, SamplingParams
from adaflash.methods import method_of
from adaflash.models.loading import Target
from adaflash.serve.adapt import Adapter
from adaflash.serve.connections import ConnectionGuard, ConnectionLimits
from adaflash.serve.engine_loop import EngineLoop, Failure, Handle, Mailbox
from adaflash.serve.engine_process import EngineFacts, EngineProcess
from adaflash.serve.event_stream import EventStream
from adaflash.serve.http_errors import (
    MAX_BODY_BYTES,
    declared_too_large,
    error_body,
    error_response,
    http_error,
    json_body,
)
from adaflash.serve.metrics import CONTENT_TYPE, ServerMetrics
from adaflash.serve.openai_api import OpenAIRoutes
from adaflash.serve.protocol import BadRequest, GenerateItem, parse_generate
from adaflash.serve.stream_text import shown_text

READY_LINE = "adaflash server ready on {url}"
# Prompts up to this many characters in all are tokenized on the event loop (tens of µs), longer ones on
# the tokenizing thread. Why: handing a short prompt to the thread and back took 9 ms (median) on a 2-core
# CPU while the loop streamed 64 answers, and the request's slot in the batch stood empty meanwhile.
INLINE_ENCODE_CHARS = 4096


class EmbeddedServer:
    """The HTTP application around one Engine; `app()` builds the aiohttp Application."""

    def __init__(
        self,
        engine: Engine | EngineFacts,
        *,
        target: str,
        draft: str | None = None,
        api_key: str | None = None,
        max_new_tokens_limit: int | None = None,
        hardware: str | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        limits: ConnectionLimits | None = None,
        served_model_name: str | None = None,
        adapter: Adapter | None = None,
        stream_interval: int = 1,
        engine_process: EngineProcess | None = None,
    ) -> None:
        self.engine = engine  # an EngineFacts where the engine runs in `engine_process`
        self.engine_process = engine_process
        self.stream_interval = stream_interval
        self.adapter = adapter
        self.served_model_name = served_model_name or target
        self.limits = limits or ConnectionLimits()
        self.guard: ConnectionGuard | None = None  # set by `running.serve` once it listens
        self.target_name = target
        self.draft = draft
        self.api_key = api_key or None
        self.max_new_tokens_limit = max_new_tokens_limit
        self.hardware = hardware
        self.on_event = on_event
        # The handlers tokenize on the asyncio thread while the engine thread decodes: each side
        # gets its own tokenizer object so no Rust tokenizer is ever shared across threads.
        self.text = dataclasses.replace(engine.target, tokenizer=copy.deepcopy(engine.target.tokenizer))
        # Prompts are tokenized off the event loop (a 10 MB prompt takes seconds, and /health must still
        # answer), on one worker thread with a tokenizer of its own.
        self.encoder = dataclasses.replace(engine.target, tokenizer=copy.deepcopy(engine.target.tokenizer))
        self.encoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adaflash-tokenize")
        self.loop_thread: EngineLoop | EngineProcess | None = None
        self.started = time.time()
        self.in_flight: set[str] = set()
        self.swaps = 0
        self.metrics = ServerMetrics(self.served_model_name, self.info)
        self.max_prompt_chars = prompt_chars_limit(engine.target.tokenizer, engine.max_len)

    # -- application -------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._track, self._errors, self._auth], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/generate", self.generate)
        app.router.add_put("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_post("/flush_cache", self.flush_cache)
        app.router.add_get("/flush_cache", self.flush_cache)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/version", self.version)
        app.router.add_get("/adapt", self.adapt_info)
        app.router.add_post("/adapt/rollback", self.adapt_rollback)
        OpenAIRoutes(self).register(app)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _startup(self, _app: web.Application) -> None:
        if self.engine_process is not None:
            self.engine_process.attach(asyncio.get_running_loop())
            self.loop_thread = self.engine_process
            return
        assert isinstance(self.engine, Engine)
        engine_loop = self.loop_thread = EngineLoop(self.engine, asyncio.get_running_loop(), self.stream_interval)
        engine_loop.start()
        if self.adapter is not None:
            self.adapter.start(engine_loop.call_from_thread)

    async def _shutdown(self, _app: web.Application) -> None:
        if self.adapter is not None:  # before the engine thread: a swap may be waiting on it
            await asyncio.get_running_loop().run_in_executor(None, self.adapter.stop)
        if self.loop_thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.loop_thread.stop)
        self.encoding.shutdown(wait=False, cancel_futures=True)

    @web.middleware
    async def _track(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """Refuse a body declared over the limit (413) before reading it; tell the connection guard this
        connection is inside a request (no idle deadline applies)."""
        too_large = declared_too_large(request)
        if too_large is not None:
            return too_large
        guard, connection = self.guard, request.protocol
        if guard is None:
            return await handler(request)
        guard.mark_busy(connection)
        try:
            return await handler(request)
        finally:
            guard.mark_idle(connection)

    async def body(self, request: web.Request) -> Any:
        """The request's JSON body, within the body deadline."""
        return await json_body(request, self.limits.body_timeout)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return http_error(request, exc)
        except BadRequest as exc:
            return error_response(str(exc), exc.status, param=exc.param)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # a bug: still a JSON error, and one traceback on stderr
            traceback.print_exc(file=sys.stderr)
            return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.api_key and not request.path.startswith("/health"):
            given = request.headers.get("Authorization", "")
            if not given:
                return error_response("missing API key: send 'Authorization: Bearer KEY'", 401)
            if not hmac.compare_digest(bearer_token(given).encode(), self.api_key.encode()):
                return error_response("invalid API key", 401)
        return await handler(request)

    @property
    def method(self) -> str:
        return self.engine.method

    # -- /generate ------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await self.body(request)
        parsed = parse_generate(body, max_new_tokens_limit=self.max_new_tokens_limit)
        handles = await self.submit(parsed.items, arrived)
        try:
            if parsed.stream:
                return await self._stream(request, handles, parsed.batch)
            results = await asyncio.gather(*(self.collect(h) for h in handles))
        finally:
            self.release(handles)
        failures = [r for r in results if isinstance(r, Failure)]
        if failures:
            return error_response(failures[0].message, failures[0].status)
        payload = [r.to_json() for r in results]
        return web.json_response(payload if parsed.batch else payload[0])

    async def submit(self, items: list[GenerateItem], arrived: float, *, field: str = "text") -> list[Handle]:
        """Tokenize, check and queue `items` for the engine thread: one Handle each, whose queue gets
        its StepEvents. The caller must `release` them when it is done, whatever happened. `field` is the
        request field the prompts came from, named by the errors about them."""
        self._check_before_encoding(items, field)
        if sum(len(item.text or "") for item in items) <= INLINE_ENCODE_CHARS:
            encoded = self._encode(items, self.text)
        else:
            encoded = await asyncio.get_running_loop().run_in_executor(self.encoding, self._encode, items, self.encoder)
        requests = [self._to_request(item, ids) for item, ids in zip(items, encoded)]
        self._check_live()
        handles = []
        for item, req in zip(items, requests):
            handle = Handle(req.rid, Mailbox(), arrived, len(req.prompt_ids), stops=req.params.stop,
                            prompt_ids=req.prompt_ids if self.adapter else [], adapt=item.adapt, tag=item.tag)
            self.in_flight.add(req.rid)
            handles.append(handle)
        self.loop_thread.submit_group(list(zip(requests, handles)))
        return handles

    def release(self, handles: list[Handle]) -> None:
        """A client that left (its handler cancelled, or a stream write failed) frees its slots."""
        for handle in handles:
            self.in_flight.discard(handle.rid)
            if not handle.done:
                self.loop_thread.abort(handle.rid)
                self.metrics.aborted.inc()

    def _check_before_encoding(self, items: list[GenerateItem], field: str) -> None:
        """The checks that need no tokens: stop token ids, and text prompts too long to fit the context
        whatever their tokens (a 10 MB prompt takes seconds of CPU and hundreds of MB to tokenize, only
        to be refused after)."""
        for index, item in enumerate(items):
            self._check_stop_ids(item.params.stop_token_ids)
            if item.text is not None and len(item.text) > self.max_prompt_chars:
                where = f"{field}[{index}]" if len(items) > 1 else field
                raise BadRequest(f"'{where}' holds {len(item.text)} characters: more than fit the context of "
                                 f"{self.engine.max_len} tokens (at most {self.max_prompt_chars} characters)",
                                 param=field)

    @staticmethod
    def _encode(items: list[GenerateItem], target: Target) -> list[list[int]]:
        """Token ids of each item, by `target`'s tokenizer: the event loop's own (`text`) or the tokenizing
        thread's (`encoder`)."""
        return [target.encode(item.text) if item.text is not None else list(item.input_ids or []) for item in items]

    def _to_request(self, item: GenerateItem, ids: list[int]) -> Request:
        rid = item.rid or uuid.uuid4().hex
        if rid in self.in_flight:
            raise BadRequest(f"rid {rid!r} is already in flight", param="rid")
        req = Request(ids, item.params, prompt_text=item.text, rid=rid)
        try:
            self.engine.check(req)
        except ValueError as err:
            raise BadRequest(str(err)) from None
        return req

    def _check_stop_ids(self, stop_ids: list[int]) -> None:
        """Stop tokens must be token ids of the vocabulary, as prompt ids must."""
        vocab = self.engine.model.cfg.vocab_size
        bad = [t for t in stop_ids if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"sampling_params.stop_token_ids must be token ids in [0, {vocab}), got {bad[0]}",
                             param="sampling_params.stop_token_ids")

    def _check_live(self) -> None:
        if self.loop_thread is None or not self.loop_thread.alive:
            raise BadRequest("the engine loop is not running", 503)

    async def collect(self, handle: Handle) -> Output | Failure:
        """The request's finished Output (or its Failure), once the engine thread hands it over."""
        while (result := await self.update(handle)) is None:
            pass
        return result

    async def update(self, handle: Handle) -> Output | Failure | None:
        """Every step the engine thread has handed over for `handle` since the last call, noted: its
        finished Output, its Failure, or None while it decodes. A stream sends one chunk per call, so
        steps that arrive together (a busy event loop, `--stream-interval`) cost one write."""
        for item in await handle.queue.take():
            if isinstance(item, Failure):
                handle.done = True
                return item
            self.note(handle, item)
            if item.output is not None:
                return self.finish(handle, item.output)
        return None

    def note(self, handle: Handle, event: StepEvent) -> None:
        handle.steps += 1
        handle.ids.extend(event.new_ids)
        if not event.new_ids:
            return
        now = time.perf_counter()
        if not handle.probe:
            if handle.first_at is None:
                self.metrics.first_token(now - handle.arrived)
            self.metrics.tokens(len(event.new_ids), None if handle.last_at is None else now - handle.last_at)
        if handle.first_at is None:
            handle.first_at = now
        handle.last_at = now

    def finish(self, handle: Handle, output: Output) -> Output:
        handle.done = True
        now = time.perf_counter()
        meta = dict(output.meta_info)
        engine_e2e = meta.get("e2e_latency") or 0.0
        meta["e2e_latency"] = now - handle.arrived
        meta["queue_time"] = max(meta["e2e_latency"] - engine_e2e, 0.0)
        if handle.first_at is not None:
            meta["ttft"] = handle.first_at - handle.arrived
        meta["drafter_version"] = self.engine.drafter_version
        if not handle.probe:
            self.metrics.finished(int(meta.get("prompt_tokens") or 0), meta["e2e_latency"])
            self.metrics.speculated(meta)
            if self.adapter is not None:
                self.adapter.record(handle.rid, handle.prompt_ids, output.output_ids, output.text, meta,
                                    tag=handle.tag, train=handle.adapt)
        return dataclasses.replace(output, meta_info=meta)

    async def _stream(self, request: web.Request, handles: list[Handle], batch: bool) -> web.StreamResponse:
        # Each chunk carries the cumulative text, as SGLang's /generate stream does; a request the
        # engine thread refuses late (it re-checks) becomes an error chunk, then [DONE].
        events = await EventStream.open(request)
        send = events.send

        async def pump(index: int, handle: Handle) -> None:
            while not events.gone:
                result = await self.update(handle)
                if isinstance(result, Failure):
                    body = result.body()
                    await send({**body, "index": index} if batch else body)
                    return
                if result is None:
                    await send(self._partial(handle, index if batch else None))
                    continue
                chunk = result.to_json()
                if batch:
                    chunk["index"] = index
                await send(chunk)
                return

        await asyncio.gather(*(pump(i, h) for i, h in enumerate(handles)))
        return await events.close()

    def shown(self, handle: Handle) -> str:
        """What a stream may show of a request's text so far (`stream_text.shown_text`), decoding only
        the tokens new since its last event."""
        if handle.so_far is None:
            handle.so_far = TextSoFar(self.text.decode)
        return shown_text(handle.so_far.update(handle.ids), handle.stops)

    def _partial(self, handle: Handle, index: int | None = None) -> str:
        """A stream's chunk while it decodes, as JSON: the text so far, every id so far, meta_info (and a
        batch's `index`). Written here, not by json.dumps of a dict, because each id is encoded once, by
        the first chunk that carries it (`Handle.ids_json`; a request not streamed encodes none), where a
        dict re-encodes all of them in every chunk: 4.6 µs against 9.9 a chunk at 64 ids, and a server
        streaming 64 answers writes 64 chunks a step."""
        if handle.ids_json_count < len(handle.ids):  # the ids since the last chunk, encoded once
            added = ",".join(map(str, handle.ids[handle.ids_json_count:]))
            handle.ids_json = f"{handle.ids_json},{added}" if handle.ids_json else added
            handle.ids_json_count = len(handle.ids)
        if not handle.rid_json:
            handle.rid_json = json.dumps(handle.rid)
        tail = "" if index is None else f', "index": {index}'
        # meta_info as json.dumps writes it (floats by repr), at a fifth of its cost
        return (f'{{"text": {json.dumps(self.shown(handle), ensure_ascii=False)}, "output_ids": [{handle.ids_json}], '
                f'"meta_info": {{"id": {handle.rid_json}, "prompt_tokens": {handle.prompt_tokens}, '
                f'"completion_tokens": {len(handle.ids)}, "spec_verify_ct": {handle.steps}, "finish_reason": null, '
                f'"e2e_latency": {time.perf_counter() - handle.arrived!r}}}{tail}}}')

    # -- health and info ------------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if self.loop_thread is None or not self.loop_thread.alive:
            return error_response("the engine loop is not running", 503)
        return web.Response(status=200)

    async def health_generate(self, _request: web.Request) -> web.Response:
        self._check_live()
        ids = self.text.encode("Hi") or [0]
        req = Request(ids, SamplingParams(max_new_tokens=1), rid=f"health-{uuid.uuid4().hex}", probe=True)
        handle = Handle(req.rid, Mailbox(), time.perf_counter(), probe=True)
        self.loop_thread.submit(req, handle)
        try:
            result = await asyncio.wait_for(self.collect(handle), timeout=60)
        except asyncio.TimeoutError:
            return error_response("the engine did not answer within 60 s", 503)
        if isinstance(result, Failure):
            return error_response(result.message, 503)
        return web.Response(status=200)

    def info(self) -> dict[str, Any]:
        engine = self.engine
        loop = self.loop_thread
        avg = engine.avg_accept_length
        throughput = loop.gen_throughput() if loop else 0.0
        drafter = engine.drafter
        return {
            "engine": "embedded",
            "method": engine.method,
            "speculative_algorithm": method_of(engine.method).sglang_algorithm,
            "model_path": str(engine.target.folder),
            "target": self.target_name,
            "draft": self.draft,
            "speculative_draft_model_path": self.draft,
            "drafter_version": engine.drafter_version,
            "block_size": getattr(drafter, "block_size", None) if drafter is not None else None,
            "max_batch": engine.max_batch,
            "max_running_requests": engine.max_batch,
            "admit_batch": engine.admit_batch,
            "overlap": engine.overlap,
            "context_length": engine.max_len,
            "context_margin": engine.context_margin,  # positions a request may not use (the verified block)
            "max_new_tokens_limit": self.max_new_tokens_limit,
            "queue_depth": loop.queue_depth if loop else 0,
            "running_requests": loop.running if loop else 0,
            "avg_spec_accept_length": avg,
            "last_gen_throughput": throughput,
            "requests_served": engine.stats["requests"],
            "completion_tokens": engine.stats["completion_tokens"],
            "verify_ct": engine.stats["verify_ct"],
            "engine_passes": engine.pass_totals(),  # {kind: {steps, seconds}} since the start
            "engine_loop": loop.loop_times() if loop else None,  # steps, rows, seconds inside and between steps
            "length_rate": engine.length_rate,
            "length_policy": engine.length_policy,
            "min_length": engine.min_length,
            "device": str(engine.device),
            "hardware": self.hardware,
            "uptime": time.time() - self.started,
            "drafter_swaps": self.swaps,
            "engine_error": loop.error if loop else None,
            "open_connections": self.guard.count if self.guard else None,
            "served_model_name": self.served_model_name,
            "tokenizer_path": str(engine.target.folder),
            "internal_states": [{"avg_spec_accept_length": avg, "last_gen_throughput": throughput}],
            "version": _version(),
            "adapt": self.adapter.info() if self.adapter else None,
        }

    async def server_info(self, _request: web.Request) -> web.Response:
        return web.json_response(self.info())

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": _version(), "engine": "embedded"})

    @property
    def hub_id(self) -> str | None:
        """The target's hub id: a built-in's known id, or the target as given when it is not a path."""
        from adaflash.models.registry import BUILTINS

        if self.target_name in BUILTINS:
            return BUILTINS[self.target_name].hub_id
        return None if Path(self.target_name).expanduser().exists() else self.target_name

    async def model_info(self, _request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": str(self.engine.target.folder),
            "tokenizer_path": str(self.engine.target.folder),
            "hub_id": self.hub_id,
            "served_model_name": self.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.engine.drafter_version,
            "target": self.target_name,
            "method": self.engine.method,
            "draft_model_path": self.draft,
            "context_length": self.engine.max_len,
        })

    async def flush_cache(self, _request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed (the embedded engine keeps no prefix cache).\n")

    # -- adapting to traffic (serve --adapt) ------------------------------------------------------------
    def _adapter(self) -> Adapter:
        if self.adapter is None:
            raise BadRequest("this server does not adapt to its traffic (start it with `adaflash serve --adapt`)")
        return self.adapter

    async def adapt_info(self, _request: web.Request) -> web.Response:
        return web.json_response(self._adapter().info())

    async def adapt_rollback(self, request: web.Request) -> web.Response:
        """Serve an earlier published version again (`{"to": N}`; 0 is the drafter the server started with)."""
        adapter = self._adapter()
        body = await self.body(request)
        to = body.get("to") if isinstance(body, dict) else None
        if isinstance(to, bool) or not isinstance(to, int):
            raise BadRequest(f"'to' must be the integer version to serve, got {to!r}")
        self._check_live()
        try:
            message = await asyncio.get_running_loop().run_in_executor(None, adapter.rollback, to)
        except ValueError as err:  # DrafterError is one: a torn or pruned version
            raise BadRequest(str(err), param="to") from None
        return web.json_response({"success": True, "message": message, "drafter_version": self.engine.drafter_version})

    # -- drafter hot swap ---------------------------------------------------------------------------
    async def update_weights(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object with 'model_path'")
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("'model_path' must be the path of a drafter folder")
        version = _weight_version(body.get("weight_version", body.get("version")), path)
        self._check_live()
        if self.adapter is not None:
            return _swap_refused("this server follows its own trainer's versions (--adapt): "
                                 "POST /adapt/rollback serves an earlier one")
        if self.engine.drafter is None:
            return _swap_refused(f"method {self.engine.method!r} runs without a drafter; nothing to swap")
        try:
            await self.loop_thread.swap(path, version)
        except (ValueError, OSError) as err:  # DrafterError is a ValueError
            return _swap_refused(str(err))
        self.draft = path
        self.swaps += 1
        if self.on_event:
            self.on_event("drafter_swap", {"path": path, "version": version})
        return web.json_response({"success": True, "message": f"drafter swapped to {path}",
                                  "drafter_version": version, "num_paused_requests": 0})


def bearer_token(header: str) -> str:
    """The credentials of an `Authorization: Bearer TOKEN` header; the scheme's case does not matter
    (RFC 7235). Any other scheme gives "", which matches no key."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


# The most characters one token of a prompt can stand for, beyond the longest vocabulary entry: a
# normalizer (NFC, say) may fold up to 3 characters into one before the model's tokens are found.
NORMALIZER_SLACK = 4


def prompt_chars_limit(tokenizer: Any, context: int) -> int:
    """Characters past which a text prompt cannot fit `context` tokens, whatever it says: `context` times
    the longest vocabulary entry (a byte-level or SentencePiece entry is at least as long as the text it
    covers), times NORMALIZER_SLACK when the tokenizer normalizes text first."""
    vocab = tokenizer.get_vocab()
    longest = max((len(entry) for entry in vocab), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    slack = 1 if backend is not None and backend.normalizer is None else NORMALIZER_SLACK
    return context * max(longest, 1) * slack


def _swap_refused(message: str) -> web.Response:
    return web.json_response({"success": False, "message": message, **error_body(message, param="model_path", code=400)},
                             status=400)


def _weight_version(raw: Any, path: str) -> int | None:
    """An explicit weight_version, else `v{N}` in the folder name, else the drafter config's version."""
    if raw is not None:
        if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit())):
            raise BadRequest(f"'weight_version' must be an integer, got {raw!r}")
        return int(raw)
    match = re.fullmatch(r"v(\d+)", Path(path).name)
    if match:
        return int(match.group(1))
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
        value = (cfg.get("adaflash") or {}).get("version")
        return int(value) if value is not None else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adaflash")
    except PackageNotFoundError:
        return "0+unknown"


def hardware_name(device: Any) -> str:
    """A short name of what the engine runs on, for benchmark records (GPU model or CPU model)."""
    text = str(device)
    if text.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_model()


