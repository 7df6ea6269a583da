"""The embedded server's OpenAI-style endpoints on a tiny random target: same tokens as the engine
alone, deltas that add up to the whole answer, usage counts, and bad requests named field by field."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig

MAX_NEW = 10
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}]


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_serve_openai")


@pytest.fixture(scope="module")
def engine_alone(tiny_target):
    """Greedy token ids of a prompt string through engine.generate, one request at a time."""
    from adaflash.engine.engine import Engine
    from adaflash.engine.params import Request, SamplingParams

    engine = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=1, max_len=256))

    def run(text: str) -> list[int]:
        request = Request(tiny_target.encode(text), SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        return engine.generate([request])[0].output_ids

    return run


@pytest.fixture(scope="module")
def server(tiny_llama: Path):
    from adaflash.engine.build import build_engine
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    engine = build_engine(str(tiny_llama), "vanilla", None,
                          config=EngineConfig(max_batch=8, max_len=256), device="cpu")
    running = RunningServer(EmbeddedServer(engine, target="tiny", max_new_tokens_limit=64))
    yield running
    running.stop()


async def _post(url: str, body) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.text()


def _events(raw: str) -> list:
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), blocks
    assert blocks[-1] == "data: [DONE]"
    return [json.loads(b[len("data: "):]) for b in blocks[:-1]]


GREEDY = {"max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}


async def test_models_and_completions_give_the_engines_tokens(server, engine_alone, tiny_target):
    status, text = await _post(server.url + "/v1/completions", {"model": "tiny", "prompt": ["Hello there", "Say hi"],
                                                                **GREEDY})
    assert status == 200, text
    body = json.loads(text)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "tiny"
    for index, prompt in enumerate(["Hello there", "Say hi"]):
        choice = body["choices"][index]
        assert choice["index"] == index and choice["finish_reason"] == "length"
        assert choice["text"] == tiny_target.decode(engine_alone(prompt))
    prompt_tokens = len(tiny_target.encode("Hello there")) + len(tiny_target.encode("Say hi"))
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 2 * MAX_NEW,
                             "total_tokens": prompt_tokens + 2 * MAX_NEW}
    async with aiohttp.ClientSession() as session, session.get(server.url + "/v1/models") as response:
        models = await response.json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


async def test_chat_applies_the_template_and_streams_deltas_that_add_up(server, engine_alone, tiny_target):
    status, text = await _post(server.url + "/v1/chat/completions", {"messages": CHAT, **GREEDY})
    assert status == 200, text
    whole = json.loads(text)
    expected = tiny_target.decode(engine_alone(tiny_target.render(CHAT)))
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": expected}
    assert whole["usage"]["prompt_tokens"] == len(tiny_target.encode(tiny_target.render(CHAT)))

    body = {"messages": CHAT, **GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/v1/chat/completions",
                                                                json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        chunks = _events((await response.read()).decode())
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]]
    assert "".join(deltas) == expected
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


async def test_n_samples_each_prompt_n_times_in_turn(server, engine_alone, tiny_target):
    """`n`: each prompt's answers in turn (choice index = prompt index × n + j), a prompt's tokens counted
    once in `usage`; a seeded request's copies draw with seeds of their own, the first as n=1 would."""
    prompts = ["Hello there", "Say hi"]
    status, text = await _post(server.url + "/v1/completions", {"prompt": prompts, "n": 3, **GREEDY})
    assert status == 200, text
    body = json.loads(text)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["text"] for c in body["choices"]] == [tiny_target.decode(engine_alone(p)) for p in prompts for _ in range(3)]
    prompt_tokens = sum(len(tiny_target.encode(p)) for p in prompts)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 6 * MAX_NEW,
                             "total_tokens": prompt_tokens + 6 * MAX_NEW}

    sampled = {"messages": CHAT, "max_tokens": MAX_NEW, "temperature": 1.5, "seed": 7, "ignore_eos": True}
    status, text = await _post(server.url + "/v1/chat/completions", {**sampled, "n": 4})
    assert status == 200, text
    answers = [c["message"]["content"] for c in json.loads(text)["choices"]]
    status, text = await _post(server.url + "/v1/chat/completions", sampled)
    assert answers[0] == json.loads(text)["choices"][0]["message"]["content"]
    assert len(set(answers)) > 1  # a tiny random target at temperature 1.5: four seeds, not one answer

    async with aiohttp.ClientSession() as session, session.post(
            server.url + "/v1/chat/completions", json={**sampled, "n": 4, "stream": True,
                                                       "stream_options": {"include_usage": True}}) as response:
        chunks = _events((await response.read()).decode())
    streamed = ["".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                        if c["choices"] and c["choices"][0]["index"] == i) for i in range(4)]
    assert streamed == answers
    assert chunks[-1]["usage"]["prompt_tokens"] == len(tiny_target.encode(tiny_target.render(CHAT)))


async def test_continuous_usage_stats_count_every_chunk(server, tiny_target):
    """stream_options.continuous_usage_stats (vLLM's, honoured with include_usage): each text chunk says
    its request's tokens so far, rising to the last chunk's total; without include_usage, none do."""
    body = {"prompt": "Hello there", **GREEDY, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, raw = await _post(server.url + "/v1/completions", body)
    assert status == 200, raw
    chunks = _events(raw)
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == sorted(counts) and counts[-1] == MAX_NEW and len(counts) >= 2
    prompt_tokens = len(tiny_target.encode("Hello there"))
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == MAX_NEW
    body["stream_options"] = {"continuous_usage_stats": True}
    status, raw = await _post(server.url + "/v1/completions", body)
    assert status == 200 and all("usage" not in c for c in _events(raw))


async def test_a_stop_string_ends_the_answer_and_no_delta_takes_text_back(server, engine_alone, tiny_target):
    full = tiny_target.decode(engine_alone("Hello there"))
    stop = full[len(full) // 2: len(full) // 2 + 4]
    body = {"prompt": "Hello there", **GREEDY, "stop": stop, "stream": True}
    status, raw = await _post(server.url + "/v1/completions", body)
    assert status == 200, raw
    chunks = _events(raw)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[: full.find(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


BAD = [
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 0}, 400, "n must be an integer from 1 to 128, got 0"),
    ("/v1/completions", {"prompt": ["a"] * 40, "n": 128}, 400, "at most 4096 answers (prompts × n), got 5120"),
    ("/v1/completions", {"prompt": "a", "best_of": 2}, 400, "best_of=2 is not supported"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-4"}, 404, "model 'gpt-4' is not served here"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 65}, 400, "'max_tokens'=65 exceeds the limit 64"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "max_completion_tokens": 5}, 400, "not both"),
    ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be a string"),
    ("/v1/completions", {"prompt": "a", "temperature": -1}, 400, "'temperature' must be a finite number >= 0"),
    ("/v1/completions", {"prompt": "a", "stop": [""]}, 400, "'stop' must be"),
    ("/v1/completions", {"prompt": "a", "logprobs": 3}, 400, "logprobs=3 is not supported"),
    ("/v1/completions", {"prompt": "a", "bogus": 1}, 400, "unknown field 'bogus'"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400,
     "response_format={'type': 'json_object'} is not supported"),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "only with \"stream\": true"),
    ("/v1/completions", {"prompt": "a", "stream": True, "stream_options": {"continuous_usage_stats": "yes"}}, 400,
     "'stream_options.continuous_usage_stats' must be a boolean"),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), BAD, ids=[b[3] for b in BAD])
async def test_bad_requests_name_the_field(server, path, body, status, message):
    got, text = await _post(server.url + path, body)
    assert got == status, text
    assert message in json.loads(text)["error"]["message"], text


async def test_clients_defaults_are_accepted(server):
    """What the openai SDK and others send by default (nulls, n=1, zero penalties) is not an error."""
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 2, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": None, "seed": None, "user": "me", "top_p": None, "stop": None, "tools": None,
            "response_format": {"type": "text"}, "ignore_eos": None, "max_completion_tokens": None}
    status, text = await _post(server.url + "/v1/chat/completions", body)
    assert status == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] <= 2
    # no max_tokens: the chat default (256) capped by the server's --max-new-tokens-limit (64), not refused
    status, text = await _post(server.url + "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True})
    assert status == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 64


def test_copies_draw_with_seeds_of_their_own_within_range():
    """Copy j of a seeded prompt draws with seed + j, or seed - j where seed + j passes the largest seed."""
    from adaflash.engine.params import MAX_SEED, SamplingParams
    from adaflash.serve.protocol import GenerateItem, with_samples

    def seeds(seed):
        items = with_samples([GenerateItem("a", None, SamplingParams(temperature=1.0, seed=seed), rid="r")], [3])
        return [item.params.seed for item in items], [item.rid for item in items]

    assert seeds(5) == ([5, 6, 7], ["r-0", "r-1", "r-2"])
    assert seeds(MAX_SEED - 1)[0] == [MAX_SEED - 1, MAX_SEED, MAX_SEED - 3]
    assert seeds(None)[0] == [None] * 3
