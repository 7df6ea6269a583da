"""The `/generate` request body of SGLang's native API, checked field by field.

Pure parsing (no torch, no engine): every mistake becomes a `BadRequest` naming the field, which the
server answers with a 400 before anything reaches the engine thread, so a bad request can never
disturb the others being decoded.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from adaflash.engine.params import MAX_SEED, SamplingParams

# Top-level fields SGLang's GenerateReqInput accepts that the embedded engine does not implement.
# Clients (SGLang's bench_serving among them) send them with their defaults; any other value is a 400
# rather than silently ignored.
UNSUPPORTED_FIELDS = {
    "lora_path", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "image_data", "video_data", "audio_data", "modalities", "return_hidden_states", "return_routed_experts",
    "custom_logit_processor", "session_params", "input_embeds", "data_parallel_rank", "bootstrap_host",
    "bootstrap_port", "bootstrap_room",
}
HARMLESS_FIELDS = {"return_text_in_logprobs", "log_metrics", "no_logs", "routing_key", "priority"}
KNOWN_FIELDS = {"text", "input_ids", "sampling_params", "stream", "rid", "adapt", "tag"}
DEFAULTS_OK = (None, False, -1, 0, [], {})
# Prompts one request may carry (/generate's batch, /v1/completions' list); the engine loop serves
# several requests' prompts in turn, so a big request shares the engine rather than holding it.
MAX_PROMPTS_PER_REQUEST = 4096

# Sampling fields SGLang knows that the engine does not implement, with the value that means "off".
NEUTRAL_SAMPLING = {
    "min_new_tokens": 0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "no_stop_trim": False,
    "json_schema": None, "regex": None,
}


class BadRequest(ValueError):
    """A request the server refuses with a 4xx; `status` is the HTTP code, `param` the field at fault
    (OpenAI's error `param`; by default the first field the message names)."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param if param is not None else field_named(message)


# In this order: a message that starts `n=2 ...` names n, whatever quoted text its value holds.
FIELD_PATTERNS = (
    re.compile(r"(?:sampling_params|messages\[\d+\](?:\.content\[\d+\])?)(?:\.[a-z_]+)?"),
    re.compile(r"^([a-z_]+)="),
    re.compile(r"'([A-Za-z_][A-Za-z0-9_.]*)'"),
)


def field_named(message: str) -> str | None:
    """The request field an error message names first: `sampling_params.top_k`, `messages[2].role`,
    `n=2 ...` (as n), `'prompt'` (as prompt)."""
    for pattern in FIELD_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group(1) if match.groups() else match.group(0)
    return None


@dataclass
class GenerateItem:
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    rid: str | None = None
    adapt: bool = True  # an adapting server may train on it (`"adapt": false` keeps a request out)
    tag: str | None = None  # a domain label: an adapting server reports τ per tag


@dataclass
class GenerateInput:
    items: list[GenerateItem]
    batch: bool
    stream: bool


def parse_generate(body: Any, *, max_new_tokens_limit: int | None = None,
                   max_batch: int = MAX_PROMPTS_PER_REQUEST) -> GenerateInput:
    """Check a decoded JSON body; raise BadRequest with the offending field named."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    for key, value in body.items():
        if key in KNOWN_FIELDS or key in HARMLESS_FIELDS:
            continue
        if key in UNSUPPORTED_FIELDS:
            if value in DEFAULTS_OK:
                continue
            raise BadRequest(f"field {key!r} is not supported by the embedded engine", param=key)
        raise BadRequest(f"unknown field {key!r}", param=key)
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}")
    texts: list[str | None]
    ids: list[list[int] | None]
    if has_text:
        raw = body["text"]
        batch = isinstance(raw, list)
        texts = list(raw) if batch else [raw]
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("'text' must be a string or a list of strings")
        for index, text in enumerate(texts):
            check_unicode(text, f"'text'[{index}]" if batch else "'text'")
        ids = [None] * len(texts)
    else:
        raw = body["input_ids"]
        if not isinstance(raw, list) or not raw:
            raise BadRequest("'input_ids' must be a non-empty list of integers or a list of such lists")
        batch = isinstance(raw[0], list)
        ids = list(raw) if batch else [raw]
        for row in ids:
            if not isinstance(row, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise BadRequest("'input_ids' must be a list of integers or a list of lists of integers")
        texts = [None] * len(ids)
    count = len(texts)
    if count == 0:
        raise BadRequest("the batch is empty")
    if count > max_batch:
        raise BadRequest(f"a batch holds at most {max_batch} prompts, got {count}")
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if not batch or len(raw_params) != count:
            raise BadRequest("a list of 'sampling_params' needs a batched input of the same length")
        param_list = [parse_sampling(p, max_new_tokens_limit) for p in raw_params]
        counts = [sample_count(p.get("n") if isinstance(p, dict) else None, f"sampling_params[{i}].n")
                  for i, p in enumerate(raw_params)]
    else:
        one = parse_sampling(raw_params, max_new_tokens_limit)
        param_list = [one] + [parse_sampling(raw_params, max_new_tokens_limit) for _ in range(count - 1)]
        counts = [sample_count(raw_params.get("n") if isinstance(raw_params, dict) else None, "sampling_params.n")] * count
    if sum(counts) > max_batch:
        raise BadRequest(f"a request asks for at most {max_batch} answers (prompts × n), got {sum(counts)}",
                         param="sampling_params.n")
    rids = _rids(body.get("rid"), batch, count)
    adapt, tag = adapt_fields(body)
    items = [GenerateItem(texts[i], ids[i], param_list[i], rids[i], adapt, tag) for i in range(count)]
    # n > 1 answers with a list, as SGLang does: each prompt's n answers in turn
    return GenerateInput(with_samples(items, counts), batch or max(counts) > 1, stream)


MAX_SAMPLES = 128  # answers one prompt may ask for (OpenAI's own limit)


def sample_count(raw: Any, name: str) -> int:
    """`n`: how many answers to sample for a prompt (null: 1)."""
    if raw is None:
        return 1
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= MAX_SAMPLES:
        raise BadRequest(f"{name} must be an integer from 1 to {MAX_SAMPLES}, got {raw!r}", param=name.split("[")[0])
    return raw


def with_samples(items: list[GenerateItem], counts: list[int]) -> list[GenerateItem]:
    """Each item `counts[i]` times in a row, each copy its own request. Copy j of a seeded request draws with
    seed + j (seed - j past the largest seed), so copy 0 is the answer n=1 gives and the others differ from
    it; a given rid becomes rid-j. Greedy copies are alike, as OpenAI's are."""
    out: list[GenerateItem] = []
    for item, n in zip(items, counts):
        if n == 1:
            out.append(item)
            continue
        seed = item.params.seed
        for j in range(n):
            copy_seed = None if seed is None else seed + j if seed + j <= MAX_SEED else seed - j
            params = dataclasses.replace(item.params, stop=list(item.params.stop),
                                         stop_token_ids=list(item.params.stop_token_ids), seed=copy_seed)
            out.append(dataclasses.replace(item, params=params, rid=None if item.rid is None else f"{item.rid}-{j}"))
    return out


MAX_TAG_CHARS = 64


def adapt_fields(body: dict[str, Any]) -> tuple[bool, str | None]:
    """The request's `adapt` (may an adapting server train on it; default true) and `tag` (its domain)."""
    adapt = body.get("adapt", True)
    if not isinstance(adapt, bool):
        raise BadRequest(f"'adapt' must be a boolean, got {adapt!r}")
    tag = body.get("tag")
    if tag is not None and (not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS
                            or not tag.isprintable()):
        raise BadRequest(f"'tag' must be a printable string of 1 to {MAX_TAG_CHARS} characters, got {tag!r}")
    return adapt, tag


def check_unicode(text: str, name: str) -> None:
    """JSON may carry lone surrogates (\\ud800) that no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadRequest(f"{name} is not valid Unicode: a lone surrogate at character {err.start}") from None


def _rids(raw: Any, batch: bool, count: int) -> list[str | None]:
    if raw is None:
        return [None] * count
    if batch:
        if not isinstance(raw, list) or len(raw) != count or not all(isinstance(r, str) and r for r in raw):
            raise BadRequest("'rid' of a batch must be a list of non-empty strings, one per prompt")
        if len(set(raw)) != len(raw):
            raise BadRequest("'rid' values must be unique")
        for rid in raw:
            check_unicode(rid, "'rid'")
        return list(raw)
    if not isinstance(raw, str) or not raw:
        raise BadRequest("'rid' must be a non-empty string")
    check_unicode(raw, "'rid'")
    return [raw]


def parse_sampling(raw: Any, max_new_tokens_limit: int | None = None) -> SamplingParams:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest(f"'sampling_params' must be a JSON object, got {type(raw).__name__}")
    for key, neutral in NEUTRAL_SAMPLING.items():
        if key in raw and raw[key] is not None and raw[key] != neutral:
            raise BadRequest(f"sampling_params.{key}={raw[key]!r} is not supported by the embedded engine")
    for key in ("temperature", "top_p", "top_k", "max_new_tokens"):
        if isinstance(raw.get(key), bool):
            raise BadRequest(f"sampling_params.{key} must be a number, got {raw[key]!r}")
    if "ignore_eos" in raw and not isinstance(raw["ignore_eos"], bool):
        raise BadRequest(f"sampling_params.ignore_eos must be a boolean, got {raw['ignore_eos']!r}")
    stop_ids = raw.get("stop_token_ids")
    if stop_ids is not None and (not isinstance(stop_ids, list)
                                 or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids)):
        raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
    cleaned = {k: v for k, v in raw.items() if k not in NEUTRAL_SAMPLING and k != "n"}  # n: `sample_count`
    default_tokens = SamplingParams.max_new_tokens
    if cleaned.get("max_new_tokens") is None and max_new_tokens_limit is not None:
        cleaned["max_new_tokens"] = min(default_tokens, max_new_tokens_limit)  # the default, capped: not refused
    if cleaned.get("sampling_seed") is not None:  # SGLang's name for the per-request seed
        if cleaned.get("seed") is not None and cleaned["seed"] != cleaned["sampling_seed"]:
            raise BadRequest("give 'sampling_params.seed' or 'sampling_params.sampling_seed', not both",
                             param="sampling_params.seed")
        cleaned["seed"] = cleaned["sampling_seed"]
    cleaned.pop("sampling_seed", None)
    for key in ("seed", "min_p"):
        if isinstance(cleaned.get(key), bool):
            raise BadRequest(f"sampling_params.{key} must be a number, got {cleaned[key]!r}",
                             param=f"sampling_params.{key}")
    if cleaned.get("stop_token_ids") is None:
        cleaned.pop("stop_token_ids", None)
    try:
        params = SamplingParams.from_dict(cleaned)
        params.validate(max_new_tokens_limit=max_new_tokens_limit)
    except (ValueError, TypeError) as err:
        raise BadRequest(str(err)) from None
    for stop in params.stop:
        check_unicode(stop, "sampling_params.stop")
    return params
