"""What third-party clients need from the embedded server: the official `openai` SDK, model lookup,
seeds, token-id prompts, OpenAI error fields, Prometheus metrics, tokenize, and streams that flush each
engine step as it comes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig

NAME = "tiny-chat"
CHAT = [{"role": "user", "content": "Name three colors."}]


def _start(tiny_llama: Path, **kw):
    from adaflash.engine.build import build_engine
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    engine = build_engine(str(tiny_llama), "vanilla", None,
                          config=EngineConfig(max_batch=4, max_len=256), device="cpu")
    return RunningServer(EmbeddedServer(engine, target=str(tiny_llama), served_model_name=NAME,
                                        max_new_tokens_limit=64, **kw))


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_serve_clients")


@pytest.fixture(scope="module")
def server(tiny_llama):
    running = _start(tiny_llama)
    yield running
    running.stop()


async def _post(url: str, body) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def test_the_openai_sdk_lists_retrieves_completes_and_streams(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [NAME]
    model = client.models.retrieve(NAME)
    assert model.id == NAME and model.owned_by == "adaflash"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.body["param"] == "model"

    whole = client.completions.create(model=NAME, prompt="Hello there", max_tokens=6, temperature=0)
    assert whole.choices[0].finish_reason in ("length", "stop") and whole.usage.completion_tokens <= 6

    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0)
    stream = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    seeded = [client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                        seed=42).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]

    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt="a", max_tokens=2, extra_body={"repetition_penalty": 1.3})
    assert refused.value.body["param"] == "repetition_penalty" and refused.value.body["code"] == 400


async def test_models_answer_by_id_and_expose_the_tokenizer(server, tiny_llama):
    status, text = await _get(server.url + "/v1/models")
    card = json.loads(text)["data"][0]
    assert card["id"] == NAME and card["root"] == str(tiny_llama) and card["max_model_len"] == 256
    assert Path(card["tokenizer_path"], "tokenizer.json").is_file() or Path(card["tokenizer_path"]).is_dir()
    for name in (NAME, str(tiny_llama)):
        status, text = await _get(server.url + "/v1/models/" + name)
        assert status == 200 and json.loads(text)["id"] == NAME
    status, text = await _get(server.url + "/v1/models/nope")
    assert status == 404 and json.loads(text)["error"] == {
        "message": "model 'nope' is not served here; this server serves 'tiny-chat'", "type": "NotFound",
        "param": "model", "code": 404}


async def test_seed_makes_sampling_reproducible_per_request(server):
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1.0, "ignore_eos": True}
    seeded = [(await _post(server.url + "/v1/completions", {**body, "seed": 7}))[1]["choices"][0]["text"]
              for _ in range(2)]
    batched = (await _post(server.url + "/v1/completions", {**body, "seed": 7, "prompt": ["Hi", "Once upon a time"]}))
    assert seeded[0] == seeded[1] == batched[1]["choices"][1]["text"]
    native = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 10, "temperature": 1.0,
                                                              "ignore_eos": True, "sampling_seed": 7}}
    status, out = await _post(server.url + "/generate", native)
    assert status == 200 and out["text"] == seeded[0]
    status, other = await _post(server.url + "/v1/completions", {**body, "seed": 8})
    assert status == 200


async def test_token_id_prompts_answer_like_their_text(server, tiny_target):
    ids = tiny_target.encode("Hello there")
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    _, by_text = await _post(server.url + "/v1/completions", {"prompt": "Hello there", **greedy})
    _, by_ids = await _post(server.url + "/v1/completions", {"prompt": ids, **greedy})
    _, batch = await _post(server.url + "/v1/completions", {"prompt": [ids, ids], **greedy})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert [c["text"] for c in batch["choices"]] == [by_text["choices"][0]["text"]] * 2
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    status, error = await _post(server.url + "/v1/completions", {"prompt": [10**7], **greedy})
    assert status == 400 and error["error"]["param"] == "prompt", error


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "a", "repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "a", "min_p": 2}, "min_p"),
    ("/v1/completions", {"prompt": "a", "seed": "x"}, "seed"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("/generate", {"text": "a", "sampling_params": {"repetition_penalty": 1.1}}, "sampling_params.repetition_penalty"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
])
async def test_errors_carry_openai_param_and_code(server, path, body, param):
    status, out = await _post(server.url + path, body)
    assert status == 400 and out["error"]["param"] == param and out["error"]["code"] == 400, out


async def test_min_p_is_accepted_in_both_dialects(server):
    status, out = await _post(server.url + "/v1/completions", {"prompt": "a", "max_tokens": 3, "min_p": 0.1,
                                                               "temperature": 0.8})
    assert status == 200, out
    status, out = await _post(server.url + "/generate", {"text": "a", "sampling_params": {
        "max_new_tokens": 3, "min_p": 0.1, "temperature": 0.8}})
    assert status == 200, out


async def test_metrics_parse_as_prometheus_and_count_what_was_served(server):
    from prometheus_client.parser import text_string_to_metric_families

    def samples(text: str) -> dict[str, float]:
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if "le" not in s.labels}

    status, before = await _get(server.url + "/metrics")
    assert status == 200
    status, _ = await _post(server.url + "/generate", {"text": "Hello", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "ignore_eos": True}})
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(server.url + "/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        after = await response.text()
    old, new = samples(before), samples(after)
    assert new["sglang:generation_tokens_total"] - old["sglang:generation_tokens_total"] == 5
    assert new["sglang:prompt_tokens_total"] > old["sglang:prompt_tokens_total"]
    assert new["sglang:num_requests_total"] - old["sglang:num_requests_total"] == 1
    assert new["sglang:time_to_first_token_seconds_count"] - old["sglang:time_to_first_token_seconds_count"] == 1
    assert new["sglang:inter_token_latency_seconds_count"] - old["sglang:inter_token_latency_seconds_count"] == 4
    assert new["sglang:e2e_request_latency_seconds_count"] >= 1
    for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                  "sglang:spec_accept_length", "adaflash:drafter_version"):
        assert gauge in new, gauge
    assert new["sglang:num_queue_reqs"] == 0


async def test_version_and_tokenize_round_trip(server, tiny_target):
    status, text = await _get(server.url + "/version")
    assert status == 200 and json.loads(text)["version"]
    status, out = await _post(server.url + "/v1/tokenize", {"prompt": "Hello there", "model": NAME})
    assert status == 200 and out["tokens"] == tiny_target.encode("Hello there") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 256
    status, back = await _post(server.url + "/v1/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and back["text"] == tiny_target.decode(out["tokens"])
    status, chat = await _post(server.url + "/tokenize", {"messages": CHAT})
    assert status == 200 and chat["tokens"] == tiny_target.encode(tiny_target.render(CHAT))
    status, batch = await _post(server.url + "/v1/tokenize", {"prompt": ["a", "b c"]})
    assert status == 200 and batch["count"] == [len(t) for t in batch["tokens"]]
    for bad in ({"prompt": 5}, {"tokens": [1]}, {"prompt": "a", "messages": CHAT}, {"prompt": "\ud800"}):
        status, error = await _post(server.url + "/v1/tokenize", bad)
        assert status == 400, (bad, error)
    status, error = await _post(server.url + "/v1/detokenize", {"tokens": [-1]})
    assert status == 400 and error["error"]["param"] == "tokens"


STEP_GAP = 0.3


@pytest.fixture(scope="module")
def stepping(tiny_llama):
    """A server whose engine pauses before each step: steps come STEP_GAP apart, and the log says how
    many tokens each request had after each step."""
    running = _start(tiny_llama)
    engine = running.server.engine
    real = engine.step
    totals: list[dict[str, int]] = []

    def step():
        time.sleep(STEP_GAP)
        events = real()
        counts = dict(totals[-1]) if totals else {}
        for event in events:
            counts[event.rid] = counts.get(event.rid, 0) + len(event.new_ids)
        totals.append(counts)
        return events

    engine.step = step
    yield running, totals
    running.stop()


async def _reads(url: str, body: dict) -> list[list[dict]]:
    """The SSE events of a stream, grouped by the network read that brought them."""
    reads, pending = [], b""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        async for data in response.content.iter_any():
            pending += data
            *complete, pending = pending.split(b"\n\n")
            events = [json.loads(e[len(b"data: "):]) for e in complete if e and e != b"data: [DONE]"]
            if events:
                reads.append(events)
    return reads


async def test_a_stream_sends_each_engine_step_as_it_comes(stepping):
    running, totals = stepping
    body = {"text": "Hello", "rid": "flush", "stream": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    reads = await _reads(running.url + "/generate", body)
    after = sorted({t["flush"] for t in totals if "flush" in t})  # tokens after each step that gave some

    def step_of(count: int) -> int:
        return next(i for i, total in enumerate(after) if total >= count)

    steps_per_read = [{step_of(e["meta_info"]["completion_tokens"]) for e in events} for events in reads]
    assert all(len(steps) == 1 for steps in steps_per_read), steps_per_read
    assert len(reads) >= len(after) >= 3

    chunks = await _reads(running.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0,
                                                            "ignore_eos": True, "stream": True})
    content = [[c["choices"][0]["text"] for c in events if c["choices"] and c["choices"][0]["text"]]
               for events in chunks]
    content = [texts for texts in content if texts]
    assert len(content) >= 2 and len(content[0]) <= 2 and len(content[1]) == 1, content


async def test_concurrent_streams_are_not_held_back_by_each_other(stepping):
    running, _ = stepping
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True}
    results = await asyncio.gather(*(_reads(running.url + "/v1/completions", body) for _ in range(2)))
    assert all(len(reads) >= 2 for reads in results), results
