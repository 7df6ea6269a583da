"""`POST /v1/tokenize` and `/v1/detokenize` (also at `/tokenize`, `/detokenize`): the target's tokenizer over HTTP.

Why: clients that count tokens themselves (benchmarks sizing prompts, UIs showing the context left)
otherwise need the tokenizer files on their own machine. Fields follow SGLang and vLLM: `prompt` (a
string or a list of them) or `messages` (rendered with the chat template) in, `tokens`, `count` and
`max_model_len` out; `tokens` in, `text` out.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from adaflash.serve.openai_protocol import parse_messages
from adaflash.serve.protocol import MAX_PROMPTS_PER_REQUEST, BadRequest, check_unicode

if TYPE_CHECKING:
    from adaflash.serve.server import EmbeddedServer

TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"}
DETOKENIZE_FIELDS = {"model", "tokens"}


class TokenRoutes:
    def __init__(self, server: EmbeddedServer, names: set[str]) -> None:
        self.server = server
        self.names = names

    async def tokenize(self, request: web.Request) -> web.Response:
        body = self._object(await self.server.body(request), TOKENIZE_FIELDS)
        texts, batch = self._texts(body)
        text = self.server.encoder
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(self.server.encoding, lambda: [text.encode(t) for t in texts])
        out: dict[str, Any] = {"max_model_len": self.server.engine.max_len}
        if batch:
            out.update(tokens=ids, count=[len(i) for i in ids])
        else:
            out.update(tokens=ids[0], count=len(ids[0]))
        return web.json_response(out)

    async def detokenize(self, request: web.Request) -> web.Response:
        body = self._object(await self.server.body(request), DETOKENIZE_FIELDS)
        tokens = body.get("tokens")
        vocab = self.server.engine.model.cfg.vocab_size
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                   for t in tokens):
            raise BadRequest(f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
        return web.json_response({"text": self.server.text.decode(tokens)})

    def _object(self, body: Any, known: set[str]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
        unknown = sorted(set(body) - known)
        if unknown:
            raise BadRequest(f"unknown field {unknown[0]!r}", param=unknown[0])
        model = body.get("model")
        if model is not None and model not in self.names:
            raise BadRequest(f"model {model!r} is not served here", 404, param="model")
        return body

    def _texts(self, body: dict[str, Any]) -> tuple[list[str], bool]:
        """The texts to tokenize and whether the answer is a batch. `add_special_tokens` is accepted for
        clients that send it; the tokenizer adds what the model's configuration says either way."""
        for key in ("add_special_tokens", "add_generation_prompt"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise BadRequest(f"'{key}' must be a boolean, got {body[key]!r}", param=key)
        if (body.get("prompt") is None) == (body.get("messages") is None):
            raise BadRequest("give exactly one of 'prompt' or 'messages'", param="prompt")
        if body.get("messages") is not None:
            messages = parse_messages(body["messages"])
            try:
                return [self.server.text.render(messages)], False
            except Exception as err:  # a template that refuses the conversation
                raise BadRequest(f"'messages' do not fit the model's chat template: {err}", param="messages") from None
        prompt = body["prompt"]
        batch = isinstance(prompt, list)
        texts = prompt if batch else [prompt]
        if not texts or not all(isinstance(t, str) for t in texts) or len(texts) > MAX_PROMPTS_PER_REQUEST:
            raise BadRequest(f"'prompt' must be a string or a list of 1 to {MAX_PROMPTS_PER_REQUEST} strings",
                             param="prompt")
        for index, text in enumerate(texts):
            check_unicode(text, f"'prompt'[{index}]" if batch else "'prompt'")
        return texts, batch
