"""The embedded HTTP server on a tiny random target: batching, streaming, bad requests, auth, hot swap."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig

PROMPTS = ["Hello there", "What is 2+2?", "Tell me a story about a cat", "Name three colors.",
           "Why is the sky blue?", "Count to five", "Say hi", "A haiku about rain"]
MAX_NEW = 10


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_serve_server")


@pytest.fixture(scope="module")
def references(tiny_target) -> dict[str, list[int]]:
    """Greedy output of each prompt through engine.generate, one request at a time."""
    from adaflash.engine.engine import Engine
    from adaflash.engine.params import Request, SamplingParams

    engine = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=1, max_len=128))
    out = {}
    for text in PROMPTS:
        request = Request(tiny_target.encode(text), SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        out[text] = engine.generate([request])[0].output_ids
    return out


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tiny_target) -> Path:
    from adaflash.models.drafter_io import new_drafter, save_drafter

    return save_drafter(new_drafter("dflash", tiny_target.model.cfg, seed=1), tmp_path_factory.mktemp("d") / "draft")


def _start(tiny_llama: Path, method: str = "vanilla", draft: Path | None = None, *, mode: str = "thread",
           config: EngineConfig | None = None, **kw):
    """A server whose engine runs on a thread of this process, or in a process of its own (`adaflash serve`'s)."""
    from adaflash.engine.build import build_engine
    from adaflash.serve.engine_process import EngineProcess, EngineSpec
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    config = config or EngineConfig(max_batch=8, max_len=256)
    drafter = str(draft) if draft else None
    if mode == "process":
        process = EngineProcess(EngineSpec(str(tiny_llama), method, drafter, config, "cpu", None,
                                           kw.get("stream_interval", 1)))
        return RunningServer(EmbeddedServer(process.start_engine(), target=str(tiny_llama), draft=drafter,
                                            engine_process=process, **kw))
    engine = build_engine(str(tiny_llama), method, drafter, config=config, device="cpu")
    return RunningServer(EmbeddedServer(engine, target=str(tiny_llama), draft=drafter, **kw))


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tiny_llama, drafter_dir, references):
    running = _start(tiny_llama, "dflash", drafter_dir, mode=request.param, max_new_tokens_limit=64)
    yield running
    running.stop()


async def _post(url: str, body, *, raw: bytes | None = None, headers: dict | None = None):
    async with aiohttp.ClientSession() as session:
        data = raw if raw is not None else json.dumps(body).encode()
        async with session.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
            return r.status, await r.text()


def _gen(text=None, ids=None, **params):
    body = {"sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True, **params}}
    if text is not None:
        body["text"] = text
    if ids is not None:
        body["input_ids"] = ids
    return body


async def test_concurrent_clients_are_batched_and_match_generate_alone(server, references, tiny_target):
    url = server.url + "/generate"
    singles = [_post(url, _gen(text)) for text in PROMPTS[:4]]
    by_ids = [_post(url, _gen(ids=tiny_target.encode(PROMPTS[4])))]
    batched = [_post(url, _gen(PROMPTS[5:]))]
    results = await asyncio.gather(*singles, *by_ids, *batched)
    assert all(status == 200 for status, _ in results), results
    outputs = [json.loads(body) for _, body in results]
    for text, out in zip(PROMPTS[:5], outputs[:5]):
        assert out["output_ids"] == references[text]
        assert out["text"] == tiny_target.decode(references[text])
        meta = out["meta_info"]
        for key in ("id", "prompt_tokens", "completion_tokens", "spec_verify_ct", "spec_accept_length",
                    "spec_accept_histogram", "spec_accept_by_position", "finish_reason", "e2e_latency"):
            assert key in meta
        assert meta["completion_tokens"] == MAX_NEW and meta["finish_reason"]["type"] == "length"
    assert isinstance(outputs[5], list) and len(outputs[5]) == 3
    for text, out in zip(PROMPTS[5:], outputs[5]):
        assert out["output_ids"] == references[text]


async def test_n_answers_each_prompt_n_times_in_turn(server, references, tiny_target):
    """sampling_params.n, as SGLang's: a list, each prompt's n answers in turn (a stream's chunks carry their
    place in it as `index`); a given rid becomes rid-j; n is read per prompt from a list of sampling_params."""
    status, text = await _post(server.url + "/generate", {**_gen(PROMPTS[0], n=2), "rid": "ask"})
    assert status == 200, text
    outputs = json.loads(text)
    assert [o["output_ids"] for o in outputs] == [references[PROMPTS[0]]] * 2
    assert [o["meta_info"]["id"] for o in outputs] == ["ask-0", "ask-1"]

    body = _gen(PROMPTS[1:3])
    body["sampling_params"] = [{**body["sampling_params"], "n": 2}, {**body["sampling_params"], "n": 1}]
    status, text = await _post(server.url + "/generate", body)
    assert [o["output_ids"] for o in json.loads(text)] == [references[PROMPTS[1]]] * 2 + [references[PROMPTS[2]]]

    async with aiohttp.ClientSession() as session, session.post(
            server.url + "/generate", json={**_gen(PROMPTS[3], n=3), "stream": True}) as response:
        raw = (await response.read()).decode()
    chunks = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    finals = {c["index"]: c["output_ids"] for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert finals == {i: references[PROMPTS[3]] for i in range(3)}


async def test_streaming_sends_cumulative_chunks_then_done(server, references):
    body = {**_gen(PROMPTS[0]), "stream": True}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/generate", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    events = [block for block in raw.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len(chunks) >= 2
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == MAX_NEW
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["output_ids"] == references[PROMPTS[0]]
    assert all(chunks[i + 1]["output_ids"][: len(c["output_ids"])] == c["output_ids"] for i, c in enumerate(chunks[:-1]))


async def test_a_streamed_batch_tags_every_chunk_with_its_prompt(server, references, tiny_target):
    """A list of prompts streamed in one request: every chunk, partial or last, carries its prompt's
    `index`, the ids so far, their text and the meta_info fields; each prompt's chunks grow to its
    answer alone."""
    body = {**_gen(PROMPTS[1:3]), "stream": True}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/generate", json=body) as response:
        raw = (await response.read()).decode()
    chunks = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    for index, prompt in enumerate(PROMPTS[1:3]):
        mine = [c for c in chunks if c["index"] == index]
        assert len(mine) >= 2 and mine[-1]["output_ids"] == references[prompt]
        for chunk in mine[:-1]:
            ids = chunk["output_ids"]
            assert ids == references[prompt][: len(ids)] and chunk["text"] == tiny_target.decode(ids).rstrip("\ufffd")
            assert set(chunk["meta_info"]) == {"id", "prompt_tokens", "completion_tokens", "spec_verify_ct",
                                               "finish_reason", "e2e_latency"}
            assert chunk["meta_info"]["completion_tokens"] == len(ids) and chunk["meta_info"]["finish_reason"] is None
    assert {c["index"] for c in chunks} == {0, 1}


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_stream_interval_gathers_tokens_into_fewer_chunks(tiny_llama, references, mode):
    """--stream-interval 4 on a one-token-a-step engine: the first token at once, then chunks every 4
    tokens, the last at once."""
    running = _start(tiny_llama, stream_interval=4, mode=mode)
    try:
        body = {**_gen(PROMPTS[0]), "stream": True}
        async with aiohttp.ClientSession() as session, session.post(running.url + "/generate", json=body) as response:
            raw = (await response.read()).decode()
        chunks = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
        counts = [c["meta_info"]["completion_tokens"] for c in chunks]
        # handed out at 1, 5, 9 and 10 tokens; hand-outs that reach a busy event loop together share a chunk
        assert counts[0] == 1 and counts[-1] == MAX_NEW and set(counts[:-1]) <= {1, 5, 9} and counts == sorted(counts)
        assert chunks[-1]["output_ids"] == references[PROMPTS[0]]
        async with aiohttp.ClientSession() as session, session.post(running.url + "/generate", json=_gen(PROMPTS[0])) as response:
            assert (await response.json())["output_ids"] == references[PROMPTS[0]]  # unstreamed: unchanged
    finally:
        running.stop()


def test_the_engine_thread_hands_out_by_the_stream_interval():
    """What reaches the event loop, step by step, at interval 3: the first tokens at once, then every
    3 tokens (a step may bring several), the finish at once; each step in one call."""
    from adaflash.engine.engine import StepEvent
    from adaflash.engine.params import Output
    from adaflash.serve.engine_loop import EngineLoop, Handle

    loop = EngineLoop.__new__(EngineLoop)  # the hand-out alone: no engine, no thread
    loop.stream_interval, calls = 3, []
    loop._post = lambda fn, ready: calls.append([(q, [len(e.new_ids) for e in events]) for q, events in ready])
    a, b = Handle("a", "qa", 0.0), Handle("b", "qb", 0.0)
    loop.handles = {"a": a, "b": b}
    done = Output(rid="a", output_ids=[], text="", meta_info={}, prompt_text="", prompt_ids=[])
    steps = [[StepEvent("a", [1]), StepEvent("b", [])], [StepEvent("a", [2]), StepEvent("b", [7, 8])],
             [StepEvent("a", [3, 4])], [StepEvent("a", [5], done), StepEvent("b", [9])]]
    for events in steps:
        loop._hand_out(events)
    assert calls == [[("qa", [1])], [("qb", [0, 2])], [("qa", [1, 2])], [("qa", [1])]]
    assert "a" not in loop.handles and b.held_tokens == 1  # b's 9th token waits for two more


BAD = [
    ("malformed json", None, b"{not json"),
    ("not an object", [1, 2], None),
    ("both text and ids", {"text": "a", "input_ids": [1]}, None),
    ("neither", {"sampling_params": {}}, None),
    ("text wrong type", {"text": 5}, None),
    ("ids wrong type", {"input_ids": ["a", "b"]}, None),
    ("ids out of vocab", {"input_ids": [10**9]}, None),
    ("empty prompt", {"text": ""}, None),
    ("sampling not object", {"text": "a", "sampling_params": "x"}, None),
    ("unknown sampling field", {"text": "a", "sampling_params": {"foo": 1}}, None),
    ("unknown top-level field", {"text": "a", "bogus": True}, None),
    ("max_new_tokens zero", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, None),
    ("max_new_tokens over the limit", {"text": "a", "sampling_params": {"max_new_tokens": 65}}, None),
    ("max_new_tokens wrong type", {"text": "a", "sampling_params": {"max_new_tokens": "ten"}}, None),
    ("temperature negative", {"text": "a", "sampling_params": {"temperature": -1}}, None),
    ("top_p zero", {"text": "a", "sampling_params": {"top_p": 0}}, None),
    ("top_k zero", {"text": "a", "sampling_params": {"top_k": 0}}, None),
    ("stop_token_ids wrong", {"text": "a", "sampling_params": {"stop_token_ids": "x"}}, None),
    ("stream not bool", {"text": "a", "stream": "yes"}, None),
    ("prompt over the context", {"input_ids": [1] * 300, "sampling_params": {"max_new_tokens": 8}}, None),
    ("unsupported logprobs", {"text": "a", "return_logprob": True}, None),
    ("sampling list length", {"text": ["a", "b"], "sampling_params": [{}]}, None),
    ("top_k past int64", {"text": "a", "sampling_params": {"temperature": 1, "top_k": 2**63}}, None),
    ("temperature past float", {"text": "a", "sampling_params": {"temperature": 10**400}}, None),
    ("temperature NaN", None, b'{"text": "a", "sampling_params": {"temperature": NaN}}'),
    ("temperature Infinity", None, b'{"text": "a", "sampling_params": {"temperature": Infinity}}'),
    ("stop not a string", {"text": "a", "sampling_params": {"stop": 0}}, None),
    ("stop an object", {"text": "a", "sampling_params": {"stop": {}}}, None),
    ("n zero", {"text": "a", "sampling_params": {"n": 0}}, None),
    ("n a string", {"text": "a", "sampling_params": {"n": "2"}}, None),
    ("n past the answers a request may ask", {"text": ["a"] * 40, "sampling_params": {"n": 128}}, None),
    ("lone surrogate", {"text": "\ud800 hi"}, None),
]


async def test_bad_requests_get_400_and_never_disturb_a_running_request(server, references):
    url = server.url + "/generate"

    async def good():
        body = {**_gen(PROMPTS[2]), "stream": True}
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
            raw = (await response.read()).decode()
        return json.loads(raw.split("\n\n")[-3][len("data: "):])

    async def bad(body, raw):
        await asyncio.sleep(0.01)
        return await _post(url, body, raw=raw)

    results = await asyncio.gather(good(), *(bad(body, raw) for _, body, raw in BAD))
    assert results[0]["output_ids"] == references[PROMPTS[2]]
    for (name, _, _), (status, text) in zip(BAD, results[1:]):
        assert status == 400, (name, status, text)
        error = json.loads(text)["error"]
        assert error["type"] == "BadRequest" and error["message"], name


async def test_info_and_health_endpoints(server):
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/health") as r:
            assert r.status == 200
        async with session.get(server.url + "/health_generate") as r:
            assert r.status == 200
        async with session.get(server.url + "/get_server_info") as r:
            info = await r.json()
        async with session.get(server.url + "/get_model_info") as r:
            model = await r.json()
        async with session.get(server.url + "/nope") as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "NotFound"
    for key in ("avg_spec_accept_length", "method", "drafter_version", "max_batch", "queue_depth", "internal_states"):
        assert key in info
    assert info["method"] == "dflash" and info["speculative_algorithm"] == "DFLASH" and info["max_batch"] == 8
    assert info["admit_batch"] == 1  # a CPU prefills each request as soon as a slot is free
    assert info["overlap"] is False  # a CPU runs every op as it is called: nothing to overlap
    assert info["avg_spec_accept_length"] >= 1.0
    assert model["is_generation"] is True and Path(model["model_path"]).is_dir()


async def test_hot_swap_replaces_the_drafter_and_refuses_a_torn_one(server, tiny_target, references, tmp_path):
    from adaflash.models.drafter_io import new_drafter, save_drafter

    fresh = save_drafter(new_drafter("dflash", tiny_target.model.cfg, seed=7), tmp_path / "weights" / "v3")
    url = server.url
    inflight = asyncio.ensure_future(_post(url + "/generate", _gen(PROMPTS[3])))
    status, body = await _post(url + "/update_weights_from_disk", {"model_path": str(fresh)})
    assert status == 200 and json.loads(body)["success"] is True and json.loads(body)["drafter_version"] == 3
    status, body = await inflight
    assert status == 200 and json.loads(body)["output_ids"] == references[PROMPTS[3]]

    torn = save_drafter(new_drafter("dflash", tiny_target.model.cfg, seed=8), tmp_path / "weights" / "v4")
    weights = torn / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for bad in ({"model_path": str(torn)}, {"model_path": str(tmp_path / "missing")}, {"model_path": 5}):
        status, body = await _post(url + "/update_weights_from_disk", bad)
        assert status == 400, body
        if isinstance(bad["model_path"], str):
            assert json.loads(body)["success"] is False
    async with aiohttp.ClientSession() as session, session.get(url + "/get_server_info") as r:
        info = await r.json()
    assert info["drafter_version"] == 3 and info["draft"] == str(fresh)
    status, body = await _post(url + "/generate", _gen(PROMPTS[1]))
    assert status == 200 and json.loads(body)["output_ids"] == references[PROMPTS[1]]
    assert json.loads(body)["meta_info"]["drafter_version"] == 3


def test_api_key_is_required_except_for_health(tiny_llama):
    running = _start(tiny_llama, api_key="s3cret")

    async def check():
        body = _gen("Hello there")
        assert (await _post(running.url + "/generate", body))[0] == 401
        status, text = await _post(running.url + "/generate", body, headers={"Authorization": "Bearer nope"})
        assert status == 401 and json.loads(text)["error"]["type"] == "Unauthorized"
        assert (await _post(running.url + "/generate", body, headers={"Authorization": "Bearer s3cret"}))[0] == 200
        async with aiohttp.ClientSession() as session:
            async with session.get(running.url + "/get_server_info") as r:
                assert r.status == 401
            async with session.get(running.url + "/health") as r:
                assert r.status == 200
        status, text = await _post(running.url + "/update_weights_from_disk", {"model_path": "x"},
                                   headers={"Authorization": "Bearer s3cret"})
        assert status == 400 and "without a drafter" in json.loads(text)["message"]

    try:
        asyncio.run(check())
    finally:
        running.stop()


async def test_null_fields_take_their_defaults_as_in_sglang(server):
    status, text = await _post(server.url + "/generate", {"text": "Say hi", "sampling_params": {
        "max_new_tokens": 4, "temperature": None, "top_p": None, "stop": None, "stop_token_ids": None}})
    assert status == 200, text
    assert json.loads(text)["meta_info"]["completion_tokens"] <= 4


async def test_a_stream_never_shows_text_that_a_stop_string_takes_back(server, references, tiny_target):
    """Each chunk's text is cumulative: clients print what is new, so it may only grow."""
    full = tiny_target.decode(references[PROMPTS[0]])
    stop = full[len(full) // 2: len(full) // 2 + 4]  # spans tokens in the middle of the answer
    body = {**_gen(PROMPTS[0], stop=stop), "stream": True}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/generate", json=body) as response:
        raw = (await response.read()).decode()
    texts = [json.loads(e[len("data: "):])["text"] for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    assert texts[-1] == full[: full.find(stop)]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:])), texts


async def test_http_errors_say_what_was_wrong(server):
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/generate") as r:
            error = (await r.json())["error"]
            assert r.status == 405 and set(r.headers["Allow"].split(", ")) == {"POST", "PUT"}
            assert "GET is not allowed on /generate" in error["message"]
        async with session.post(server.url + "/health") as r:
            assert r.status == 405 and "GET" in r.headers["Allow"]
    status, text = await _post(server.url + "/generate", {"input_ids": [1] * 200, "sampling_params": {
        "max_new_tokens": 60}})
    message = json.loads(text)["error"]["message"]
    assert status == 400 and "at most" in message and "drafting and verifying" in message, message


async def test_health_probes_stay_out_of_the_served_statistics(server):
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/get_server_info") as r:
            before = await r.json()
        for _ in range(2):
            async with session.get(server.url + "/health_generate") as r:
                assert r.status == 200
        async with session.get(server.url + "/get_server_info") as r:
            after = await r.json()
    assert (after["requests_served"], after["completion_tokens"]) == (before["requests_served"],
                                                                      before["completion_tokens"])


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_client_that_leaves_frees_its_slot(tiny_llama, mode):
    """Without an abort a dropped request kept decoding its whole budget in a slot other requests need."""
    running = _start(tiny_llama, mode=mode, config=EngineConfig(max_batch=4, max_len=4096))
    long = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}

    async def leave(stream: bool) -> None:
        timeout = aiohttp.ClientTimeout(total=0.5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(asyncio.TimeoutError):
                async with session.post(running.url + "/generate", json={**long, "stream": stream}) as r:
                    await r.read()

    async def info() -> dict:
        async with aiohttp.ClientSession() as session, session.get(running.url + "/get_server_info") as r:
            return await r.json()

    async def check() -> None:
        for stream in (False, True):
            await leave(stream)
            for _ in range(100):
                state = await info()
                if state["running_requests"] == 0 and state["queue_depth"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert state["running_requests"] == 0 and state["requests_served"] == 0, state
        status, text = await _post(running.url + "/generate", {**_gen("Say hi"), "rid": "again"})
        assert status == 200, text

    try:
        asyncio.run(check())
    finally:
        running.stop()


async def test_a_streams_chunks_carry_its_rid_whatever_its_characters(server):
    rid = 'a "quoted" rid, ü \\ and \u2028'
    body = {**_gen(PROMPTS[0]), "rid": rid, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/generate", json=body) as response:
        raw = (await response.read()).decode()
    chunks = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    assert len(chunks) >= 2 and all(c["meta_info"]["id"] == rid for c in chunks)
    assert all(isinstance(c["meta_info"]["e2e_latency"], float) for c in chunks)


def test_a_benchmark_records_the_engine_passes_of_its_measured_requests(server):
    """`adaflash bench` against our server keeps the engine's passes by kind, the warm-up's left out: one
    request at a time, each of the 5 measured prompts takes one prefill (the 2 warm-ups would make 7)."""
    from adaflash.bench.client import BenchSettings, run_benchmark
    from adaflash.bench.prompts import BenchPrompt

    settings = BenchSettings(server.url, concurrency=1, max_new_tokens=6, warmup=2, ignore_eos=True)
    prompts = [BenchPrompt(str(i), text) for i, text in enumerate(PROMPTS[:5])]
    record = run_benchmark(settings, prompts, dataset="t")
    passes = record["passes"]
    assert passes["prefill"]["steps"] == 5 and passes["prefill"]["rows"] == 5 and passes["prefill"]["seconds"] > 0
    steps = sum(p["steps"] for kind, p in passes.items() if kind != "prefill")
    assert 5 <= steps <= 5 * 5  # each answer's 5 tokens after its first: at least one step, at most one a token
    assert record["completed"] == 5 and record["errors"] == []
