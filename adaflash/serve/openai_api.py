"""OpenAI-compatible endpoints over the embedded engine: GET /v1/models, POST /v1/completions and
POST /v1/chat/completions, streamed or not.

They ride on the native server's machinery (`EmbeddedServer.submit`, `collect`, `release`): the same
engine thread, batching and abort-on-disconnect; only the dialect differs. Streams send deltas (the
native stream sends the cumulative text), holding back what a stop string could still take back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from adaflash.engine.params import Output
from adaflash.serve.engine_loop import Failure, Handle
from adaflash.serve.event_stream import EventStream
from adaflash.serve.http_errors import error_response
from adaflash.serve.openai_protocol import OpenAIInput, parse_chat, parse_completion
from adaflash.serve.protocol import BadRequest, GenerateItem, with_samples
from adaflash.serve.tokenize import TokenRoutes

if TYPE_CHECKING:
    from adaflash.serve.server import EmbeddedServer

class OpenAIRoutes:
    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server

    def register(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/", self.models)  # clients that join base URL and path keep the slash
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        tokens = TokenRoutes(self.server, self.names)
        for prefix in ("/v1", ""):  # SGLang serves them under /v1, vLLM at the root
            app.router.add_post(f"{prefix}/tokenize", tokens.tokenize)
            app.router.add_post(f"{prefix}/detokenize", tokens.detokenize)

    @property
    def model_id(self) -> str:
        return self.server.served_model_name

    @property
    def names(self) -> set[str]:
        """What a request's `model` may say: the served name, the target as given, its hub id, its folder."""
        server = self.server
        return {n for n in (self.model_id, server.target_name, server.hub_id, str(server.engine.target.folder),
                            "default") if n}

    def card(self) -> dict[str, Any]:
        """The model object; `root` is where its weights and tokenizer come from (the hub id when known, as a
        tokenizer name for clients such as aiperf), `tokenizer_path` the folder this server loaded."""
        server = self.server
        return {"id": self.model_id, "object": "model", "created": int(server.started), "owned_by": "adaflash",
                "root": server.hub_id or str(server.engine.target.folder), "parent": None,
                "max_model_len": server.engine.max_len, "tokenizer_path": str(server.engine.target.folder)}

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self.card()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self.names:
            raise BadRequest(f"model {name!r} is not served here; this server serves {self.model_id!r}", 404,
                             param="model")
        return web.json_response(self.card())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        parsed = parse_completion(await self.server.body(request), max_new_tokens_limit=self.server.max_new_tokens_limit)
        self._check_model(parsed.model)
        assert parsed.prompts is not None
        return await self._answer(request, parsed, parsed.prompts, chat=False, arrived=arrived)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        parsed = parse_chat(await self.server.body(request), max_new_tokens_limit=self.server.max_new_tokens_limit)
        self._check_model(parsed.model)
        assert parsed.messages is not None
        try:
            prompt = self.server.text.render(parsed.messages)
        except Exception as err:  # a template that refuses the conversation (roles out of order, say)
            raise BadRequest(f"'messages' do not fit the model's chat template: {err}") from None
        return await self._answer(request, parsed, [prompt], chat=True, arrived=arrived)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise BadRequest(f"model {model!r} is not served here; this server serves {self.model_id!r} "
                             f"(GET /v1/models)", 404, param="model")

    async def _answer(self, request: web.Request, parsed: OpenAIInput, prompts: list[str | list[int]], *, chat: bool,
                      arrived: float) -> web.StreamResponse:
        items = with_samples([GenerateItem(p if isinstance(p, str) else None, None if isinstance(p, str) else list(p),
                                           dataclasses.replace(parsed.params, stop=list(parsed.params.stop)),
                                           adapt=parsed.adapt, tag=parsed.tag)
                              for p in prompts], [parsed.n] * len(prompts))
        try:
            handles = await self.server.submit(items, arrived, field="messages" if chat else "prompt")
        except BadRequest as err:  # the engine's checks name the native field
            if "input_ids" not in str(err):
                raise
            raise BadRequest(str(err).replace("input_ids", "'prompt' token ids"), err.status, param="prompt") from None
        reply = Reply(chat, self.model_id, parsed.n)
        try:
            if parsed.stream:
                return await self._stream(request, handles, reply, parsed.include_usage, parsed.usage_every_chunk)
            results = await asyncio.gather(*(self.server.collect(h) for h in handles))
        finally:
            self.server.release(handles)
        failures = [r for r in results if isinstance(r, Failure)]
        if failures:
            return error_response(failures[0].message, failures[0].status)
        outputs = [r for r in results if isinstance(r, Output)]
        return web.json_response(reply.whole(outputs))

    async def _stream(self, request: web.Request, handles: list[Handle], reply: Reply,
                      include_usage: bool, usage_every_chunk: bool = False) -> web.StreamResponse:
        events = await EventStream.open(request)
        send = events.send
        outputs: list[Output] = []

        async def pump(index: int, handle: Handle) -> None:
            shown = ""
            if reply.chat:
                await send(reply.chunk(index, "", None, role=True))
            while not events.gone:
                result = await self.server.update(handle)
                if isinstance(result, Failure):
                    await send(result.body())
                    return
                finish = None
                if result is not None:
                    outputs.append(result)
                    text, finish = result.text, finish_reason(result)
                else:
                    text = self.server.shown(handle)
                delta = text[len(shown):] if text.startswith(shown) else ""
                shown += delta
                if delta or finish:
                    chunk = reply.chunk(index, delta, finish)
                    if usage_every_chunk:
                        chunk["usage"] = token_counts(handle.prompt_tokens, len(handle.ids))
                    await send(chunk)
                if finish:
                    return

        await asyncio.gather(*(pump(i, h) for i, h in enumerate(handles)))
        if include_usage and len(outputs) == len(handles):
            await send({**reply.header(chunk=True), "choices": [], "usage": usage(outputs, reply.n)})
        return await events.close()


@dataclasses.dataclass
class Reply:
    """One response's id and shape: a text completion or a chat completion, whole or in chunks."""

    chat: bool
    model: str
    n: int = 1  # answers per prompt: a prompt's tokens count once in `usage`, not once an answer
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def header(self, *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{self.id}", "object": kind, "created": self.created,
                "model": self.model}

    def whole(self, outputs: list[Output]) -> dict[str, Any]:
        if self.chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": o.text}, "logprobs": None,
                        "finish_reason": finish_reason(o)} for i, o in enumerate(outputs)]
        else:
            choices = [{"index": i, "text": o.text, "logprobs": None, "finish_reason": finish_reason(o)}
                       for i, o in enumerate(outputs)]
        return {**self.header(chunk=False), "choices": choices, "usage": usage(outputs, self.n)}

    def chunk(self, index: int, delta: str, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.chat:
            body: dict[str, Any] = {"role": "assistant", "content": delta} if role else {"content": delta}
            choice = {"index": index, "delta": body, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta, "logprobs": None, "finish_reason": finish}
        return {**self.header(chunk=True), "choices": [choice]}


def finish_reason(output: Output) -> str:
    """The engine's finish (a stop token or string, or the length) as OpenAI names it."""
    finish = output.meta_info.get("finish_reason") or {}
    return "length" if finish.get("type") == "length" else "stop"


def usage(outputs: list[Output], n: int = 1) -> dict[str, int]:
    """An OpenAI `usage` object: each prompt's tokens once, whatever its n answers (outputs in any order)."""
    return token_counts(sum(int(o.meta_info["prompt_tokens"]) for o in outputs) // n,
                        sum(int(o.meta_info["completion_tokens"]) for o in outputs))


def token_counts(prompt: int, completion: int) -> dict[str, int]:
    """An OpenAI `usage` object."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
