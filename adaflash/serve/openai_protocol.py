"""The OpenAI-style request bodies (`/v1/completions`, `/v1/chat/completions`), checked field by field.

Why: most clients (the `openai` SDK, LangChain, curl snippets) speak this dialect, and SGLang serves it
beside its native one. Like `protocol.parse_generate`, pure parsing: every mistake is a BadRequest
naming the field, answered with a 400 before anything reaches the engine thread. A field this engine
does not implement is refused unless it holds the value that means "off", never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaflash.engine.params import SamplingParams
from adaflash.serve.protocol import (
    MAX_PROMPTS_PER_REQUEST,
    BadRequest,
    adapt_fields,
    check_unicode,
    sample_count,
)

# OpenAI's documented defaults where they differ from the native API's.
COMPLETION_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 256  # OpenAI's is "up to the context"; a bounded default keeps one request from holding a slot long
DEFAULT_TEMPERATURE = 1.0

# Fields clients send with these values by default: accepted only with a value that means "off".
# (null always means "off"; values compare with their JSON type, so `true` is not `1`)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "best_of": (1,), "echo": (False,), "logprobs": (False, 0), "top_logprobs": (0,),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "suffix": (),
    "repetition_penalty": (1, 1.0), "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},),
}
# The engine's messages name the native fields; these requests name them at the top level.
RENAMED = {"sampling_params.max_new_tokens": "'max_tokens'", "sampling_params.temperature": "'temperature'",
           "sampling_params.top_p": "'top_p'", "sampling_params.top_k": "'top_k'", "sampling_params.min_p": "'min_p'",
           "sampling_params.seed": "'seed'"}
HARMLESS = {"user", "metadata", "store", "service_tier", "stream_options", "model"}
COMMON = {"n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream", "ignore_eos", "adapt", "tag"}
ROLES = ("system", "user", "assistant", "developer")


@dataclass
class OpenAIInput:
    prompts: list[str | list[int]] | None  # /v1/completions: the raw prompts (no chat template), text or token ids
    messages: list[dict[str, str]] | None  # /v1/chat/completions: one conversation, roles and text
    params: SamplingParams
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts
    model: str | None
    adapt: bool = True  # the native API's fields, sent by SDKs as extra body fields
    tag: str | None = None
    # stream_options.continuous_usage_stats (vLLM's), with include_usage: every chunk carries its
    # request's counts so far, which tells a chunk of several tokens (a speculative step) from one
    usage_every_chunk: bool = False
    n: int = 1  # answers sampled for each prompt (choice index: prompt index × n + j)


def parse_completion(body: Any, *, max_new_tokens_limit: int | None = None) -> OpenAIInput:
    body = _object(body)
    _check_fields(body, COMMON | {"prompt"})
    raw = body.get("prompt")
    prompts: list = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and all(map(_token, raw))) \
        else raw if isinstance(raw, list) else [raw]
    if not prompts or not all(isinstance(p, str) or (isinstance(p, list) and p and all(map(_token, p)))
                              for p in prompts):
        raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids (integers >= 0) "
                         "or a list of such lists, none empty", param="prompt")
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        raise BadRequest(f"'prompt' holds at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got {len(prompts)}")
    n = sample_count(body.get("n"), "n")
    if len(prompts) * n > MAX_PROMPTS_PER_REQUEST:
        raise BadRequest(f"a request asks for at most {MAX_PROMPTS_PER_REQUEST} answers (prompts × n), "
                         f"got {len(prompts) * n}", param="n")
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            check_unicode(prompt, f"'prompt'[{index}]" if len(prompts) > 1 else "'prompt'")
    return OpenAIInput(prompts, None, *_common(body, COMPLETION_MAX_TOKENS, max_new_tokens_limit), *adapt_fields(body),
                       usage_every_chunk=_usage_every_chunk(body), n=n)


def parse_chat(body: Any, *, max_new_tokens_limit: int | None = None) -> OpenAIInput:
    body = _object(body)
    _check_fields(body, COMMON | {"messages", "max_completion_tokens"})
    messages = parse_messages(body.get("messages"))
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None and body["max_tokens"] != body["max_completion_tokens"]:
            raise BadRequest("give 'max_completion_tokens' or 'max_tokens', not both")
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    return OpenAIInput(None, messages, *_common(body, CHAT_MAX_TOKENS, max_new_tokens_limit), *adapt_fields(body),
                       usage_every_chunk=_usage_every_chunk(body), n=sample_count(body.get("n"), "n"))


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_messages(raw: Any) -> list[dict[str, str]]:
    """A chat conversation: a non-empty list of {role, content} objects, content text only."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    return [_message(m, i) for i, m in enumerate(raw)]


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_fields(body: dict[str, Any], known: set[str]) -> None:
    for key, value in body.items():
        if key in known or key in HARMLESS:
            continue
        if key in NEUTRAL:
            if value is None or any(value == off and type(value) is type(off) for off in NEUTRAL[key]):
                continue
            raise BadRequest(f"{key}={value!r} is not supported by the embedded engine", param=key)
        raise BadRequest(f"unknown field {key!r}", param=key)


def _message(raw: Any, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object with 'role' and 'content'")
    role, content = raw.get("role"), raw.get("content")
    if role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{j}] must be {{'type': 'text', 'text': ...}} (text only)")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f"{where}.content must be a string or a list of text parts")
    check_unicode(content, f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _usage_every_chunk(body: dict[str, Any]) -> bool:
    """stream_options.continuous_usage_stats, as vLLM reads it: only with include_usage."""
    options = body.get("stream_options") or {}
    every = options.get("continuous_usage_stats", False) if isinstance(options, dict) else False
    if not isinstance(every, bool):
        raise BadRequest(f"'stream_options.continuous_usage_stats' must be a boolean, got {every!r}")
    return every and bool(options.get("include_usage", False))


def _common(body: dict[str, Any], default_tokens: int,
            limit: int | None) -> tuple[SamplingParams, bool, bool, str | None]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise BadRequest("'stream_options' must be an object, and only with \"stream\": true")
    include_usage = bool((options or {}).get("include_usage", False))
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("'stop' must be a non-empty string or a list of them")
    for stop_text in stops:
        check_unicode(stop_text, "'stop'")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {model!r}")
    for key in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed"):
        if isinstance(body.get(key), bool):
            raise BadRequest(f"'{key}' must be a number, got {body[key]!r}")
    max_tokens = body.get("max_tokens")
    params = SamplingParams(
        max_new_tokens=min(default_tokens, limit or default_tokens) if max_tokens is None else max_tokens,
        temperature=DEFAULT_TEMPERATURE if body.get("temperature") is None else body["temperature"],
        top_p=1.0 if body.get("top_p") is None else body["top_p"],
        top_k=-1 if body.get("top_k") is None else body["top_k"],
        stop=list(stops),
        ignore_eos=False if body.get("ignore_eos") is None else body["ignore_eos"],
        min_p=0.0 if body.get("min_p") is None else body["min_p"],
        seed=body.get("seed"),
    )
    if not isinstance(params.ignore_eos, bool):
        raise BadRequest(f"'ignore_eos' must be a boolean, got {params.ignore_eos!r}")
    try:
        params.validate(max_new_tokens_limit=limit)
    except ValueError as err:
        message = str(err)
        for native, ours in RENAMED.items():
            message = message.replace(native, ours)
        raise BadRequest(message) from None
    return params, stream, include_usage, model
