"""The embedded server against hostile input, idle-connection floods and one client hogging the engine."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig
from tests.processes import stop_with_sigterm

PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = "9" * 5000


def _start(tiny_llama: Path, *, max_batch: int = 4, **kw):
    from adaflash.engine.build import build_engine
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    engine = build_engine(str(tiny_llama), "vanilla", None,
                          config=EngineConfig(max_batch=max_batch, max_len=256), device="cpu")
    return RunningServer(EmbeddedServer(engine, target="tiny", **kw))


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_serve_hardening")


@pytest.fixture(scope="module")
def server(tiny_llama):
    running = _start(tiny_llama, max_new_tokens_limit=64)
    yield running
    running.stop()


# (method, path, JSON body or raw bytes). Every one must get a 4xx with a JSON error, never a 500.
def _hostile() -> list[tuple[str, str, object]]:
    surrogate = "ab\ud800"
    chat = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, str, object]] = []
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk"):
        cases += [
            ("POST", path, (DEEP)),
            ("POST", path, (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}")),
            ("POST", path, (b"{not json")),
            ("POST", path, (b"\xff\xfe\x00garbage")),
            ("POST", path, (b'{"text": "a", "x": ' + HUGE.encode() + b"}")),
            ("POST", path, [1, 2, 3]),
            ("POST", path, "a string"),
            ("POST", path, 5),
            ("POST", path, {}),
            ("GET", path, None),
        ]
    cases += [
        # /generate, field by field
        ("POST", "/generate", {"text": surrogate}),
        ("POST", "/generate", {"text": ["ok", surrogate]}),
        ("POST", "/generate", {"text": "a", "rid": surrogate}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"stop": [surrogate]}}),
        ("POST", "/generate", (b'{"text": "a", "sampling_params": {"max_new_tokens": ' + HUGE.encode() + b"}}")),
        ("POST", "/generate", (b'{"text": "a", "sampling_params": {"top_k": -' + HUGE.encode() + b"}}")),
        ("POST", "/generate", (b'{"text": "a", "sampling_params": {"temperature": ' + HUGE.encode() + b"}}")),
        ("POST", "/generate", (b'{"input_ids": [' + HUGE.encode() + b"]}")),
        ("POST", "/generate", (b'{"text": "a", "sampling_params": {"stop_token_ids": [' + HUGE.encode() + b"]}}")),
        ("POST", "/generate", {"text": "a", "sampling_params": {"temperature": 1e308 * 10}}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 1.5}}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**6}}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"top_p": "high"}}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"stop": [[]]}}),
        ("POST", "/generate", {"text": "a", "sampling_params": [{}]}),
        ("POST", "/generate", {"text": [], "sampling_params": {}}),
        ("POST", "/generate", {"text": ["a"] * 4097}),
        ("POST", "/generate", {"input_ids": [[]]}),
        ("POST", "/generate", {"input_ids": [-1]}),
        ("POST", "/generate", {"input_ids": [[1], "a"]}),
        ("POST", "/generate", {"text": "a", "rid": ["x"]}),
        ("POST", "/generate", {"text": ["a", "b"], "rid": ["x", "x"]}),
        ("POST", "/generate", {"text": "a", "stream": 1}),
        ("POST", "/generate", {"text": "a", "lora_path": "x"}),
        # /v1/completions
        ("POST", "/v1/completions", {"prompt": surrogate}),
        ("POST", "/v1/completions", {"prompt": ["ok", surrogate]}),
        ("POST", "/v1/completions", {"prompt": "a", "stop": surrogate}),
        ("POST", "/v1/completions", (b'{"prompt": "a", "max_tokens": ' + HUGE.encode() + b"}")),
        ("POST", "/v1/completions", (b'{"prompt": "a", "n": ' + HUGE.encode() + b"}")),
        ("POST", "/v1/completions", {"prompt": ["a"] * 4097}),
        ("POST", "/v1/completions", {"prompt": []}),
        ("POST", "/v1/completions", {"prompt": [[]]}),
        ("POST", "/v1/completions", {"prompt": "a", "model": 5}),
        ("POST", "/v1/completions", {"prompt": "a", "model": "other"}),
        ("POST", "/v1/completions", {"prompt": "a", "max_tokens": -1}),
        ("POST", "/v1/completions", {"prompt": "a", "top_p": 2}),
        ("POST", "/v1/completions", {"prompt": "a", "stream_options": "yes", "stream": True}),
        ("POST", "/v1/completions", {"prompt": "a", "echo": True}),
        # /v1/chat/completions
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": surrogate}]}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text",
                                                                                       "text": surrogate}]}]}),
        ("POST", "/v1/chat/completions", {"messages": chat, "stop": [surrogate]}),
        ("POST", "/v1/chat/completions", (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": '
                                              + HUGE.encode() + b"}")),
        ("POST", "/v1/chat/completions", {"messages": "hi"}),
        ("POST", "/v1/chat/completions", {"messages": [None]}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}),
        ("POST", "/v1/chat/completions", {"messages": chat, "temperature": "hot"}),
        ("POST", "/v1/chat/completions", {"messages": chat, "tools": [{"type": "function"}]}),
        # tokenize, models
        ("POST", "/v1/tokenize", {"prompt": surrogate}),
        ("POST", "/v1/tokenize", {"prompt": ["a", 5]}),
        ("POST", "/v1/tokenize", {"messages": [{"role": "user", "content": surrogate}]}),
        ("POST", "/v1/tokenize", {"prompt": "a", "add_special_tokens": "yes"}),
        ("POST", "/v1/tokenize", DEEP),
        ("POST", "/v1/tokenize", [1]),
        ("POST", "/v1/detokenize", {"tokens": [10**9]}),
        ("POST", "/v1/detokenize", ('{"tokens": [' + HUGE + "]}").encode()),
        ("POST", "/v1/detokenize", {"tokens": "abc"}),
        ("POST", "/tokenize", {}),
        ("GET", "/v1/models/" + "x" * 5000, None),
        ("GET", "/v1/models/%ED%A0%80", None),
        ("POST", "/v1/completions", {"prompt": [1, -2]}),
        ("POST", "/v1/completions", {"prompt": [[1], [True]]}),
        ("POST", "/v1/completions", {"prompt": "a", "seed": 2**70}),
        ("POST", "/v1/completions", {"prompt": "a", "min_p": -0.1}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"seed": 1, "sampling_seed": 2}}),
        ("POST", "/generate", {"text": "a", "sampling_params": {"seed": True}}),
        ("POST", "/metrics", None),
        # the rest
        ("POST", "/update_weights_from_disk", {"model_path": 5}),
        ("POST", "/update_weights_from_disk", (b'{"model_path": "x", "weight_version": ' + HUGE.encode() + b"}")),
        ("POST", "/update_weights_from_disk", {"model_path": "/nonexistent", "weight_version": -1.5}),
        ("GET", "/no/such/endpoint", None),
        ("DELETE", "/v1/models", None),
        ("POST", "/health", None),
    ]
    return cases


HOSTILE = _hostile()


async def test_hostile_input_gets_4xx_never_500(server):
    statuses = []
    async with aiohttp.ClientSession() as session:
        for method, path, body in HOSTILE:
            data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
            async with session.request(method, server.url + path, data=data,
                                       headers={"Content-Type": "application/json"}) as response:
                text = await response.text()
                statuses.append(response.status)
                assert 400 <= response.status < 500, (method, path, str(body)[:80], response.status, text[:300])
                error = json.loads(text)["error"]
                assert error["message"], text
    assert len(statuses) == len(HOSTILE)
    async with aiohttp.ClientSession() as session, session.get(server.url + "/health") as response:
        assert response.status == 200


@pytest.mark.parametrize(("path", "raw", "field"), [
    ("/v1/completions", b'{"prompt": "ab\\ud800"}', "'prompt'"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "ab\\ud800"}]}', "messages[0].content"),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": ' + HUGE.encode() + b"}}",
     "sampling_params.max_new_tokens"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": ' + HUGE.encode() + b"}", "'max_tokens'"),
    ("/generate", DEEP, "nests JSON"),
])
async def test_the_former_500s_are_400s_naming_the_field(server, path, raw, field):
    async with aiohttp.ClientSession() as session, session.post(server.url + path, data=raw) as response:
        assert response.status == 400, await response.text()
        assert field in (await response.json())["error"]["message"]


def _recv_closed(sock: socket.socket, timeout: float = 20.0) -> bool:
    """Whether the server closes `sock` (reads until EOF, ignoring a response) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_idle_and_half_sent_connections_are_closed_and_the_cap_makes_room(tiny_llama):
    from adaflash.serve.connections import ConnectionLimits

    running = _start(tiny_llama, limits=ConnectionLimits(header_timeout=0.5, keepalive_timeout=0.5,
                                                         max_connections=8))
    host, port = running.url.removeprefix("http://").split(":")
    try:
        half = socket.create_connection((host, int(port)))
        half.sendall(PARTIAL_HEAD)
        assert _recv_closed(half), "a connection that never finished its request head stayed open"
        idle = socket.create_connection((host, int(port)))
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _recv_closed(idle), "an idle keep-alive connection stayed open"
        guard = running.server.guard
        assert guard is not None and guard.timed_out >= 2

        # past the cap: the oldest idle connections make room, and a new client is served
        slow = ConnectionLimits(header_timeout=300, keepalive_timeout=300, max_connections=8)
        guard.limits = slow
        held = [socket.create_connection((host, int(port))) for _ in range(20)]
        for sock in held:
            sock.sendall(PARTIAL_HEAD)
        for _ in range(3):
            status, _ = _http_get(host, int(port), "/health")
            assert status == 200
        assert guard.evicted >= 12 and guard.count <= 8
        for sock in held:
            sock.close()
    finally:
        running.stop()


def _http_get(host: str, port: int, path: str, timeout: float = 10.0) -> tuple[int, float]:
    """Status and seconds of one GET on a fresh connection (plain sockets: no client pool)."""
    started = time.perf_counter()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    elapsed = time.perf_counter() - started
    return int(data.split(b" ", 2)[1]), elapsed


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64


SERVER_FDS = 4096  # the served process's open-files limit: a flood must not be able to use them all


def _server_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_FDS, SERVER_FDS))


@pytest.mark.skipif(sys.platform != "linux", reason="counts file descriptors in /proc")
def test_health_answers_within_100_ms_beside_20000_idle_connections(tiny_llama, workspace):
    """The server in its own process, flooded by more connections than it has file descriptors, each
    sending half a request head and then nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    count = min(20_000, hard - _open_fds() - 64)
    if count < 2 * SERVER_FDS:
        pytest.skip(f"the open-files limit ({hard}) leaves room for {count} connections only")
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaflash.cli.main", "serve", "--target", str(tiny_llama), "--port", "0",
         "--device", "cpu", "--max-batch", "2", "--context-length", "128", "--header-timeout", "600",
         "--keepalive-timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_server_limit)
    held: list[socket.socket] = []
    try:
        line = proc.stdout.readline()
        assert "ready on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        host, port = line.strip().rsplit("http://", 1)[1].split(":")
        started = time.perf_counter()
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.sendall(PARTIAL_HEAD)
            held.append(sock)
        print(f"opened {count} connections in {time.perf_counter() - started:.1f} s")
        _http_get(host, int(port), "/health")  # the server has taken every connection in by now
        times = []
        for _ in range(7):
            status, seconds = _http_get(host, int(port), "/health")
            assert status == 200
            times.append(seconds)
        assert statistics.median(times) < 0.1, (count, times)
        status, _ = _http_get(host, int(port), "/get_server_info")
        assert status == 200
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        err = stop_with_sigterm(proc, timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "Too many open files" not in err and len(err) < 20_000, err[-2000:]


async def test_a_big_request_does_not_starve_a_small_one(tiny_llama):
    """Prompts of different requests take turns for free slots: a one-prompt request sent after a
    40-prompt one finishes first (in arrival order it would wait for all 40)."""
    running = _start(tiny_llama, max_batch=2)
    big = {"text": [f"Story number {i}" for i in range(40)],
           "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    small = {"text": "Say hi", "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    finished: list[str] = []

    async def send(name: str, body: dict, session: aiohttp.ClientSession) -> None:
        async with session.post(running.url + "/generate", json=body) as response:
            assert response.status == 200, await response.text()
            await response.read()
        finished.append(name)

    try:
        async with aiohttp.ClientSession() as session:
            first = asyncio.ensure_future(send("big", big, session))
            for _ in range(200):
                async with session.get(running.url + "/get_server_info") as response:
                    if (await response.json())["queue_depth"] > 0:
                        break
                await asyncio.sleep(0.01)
            await send("small", small, session)
            await first
    finally:
        running.stop()
    assert finished == ["small", "big"]


def test_deadlines_never_cut_a_request_in_progress_and_a_slow_body_gets_408(tiny_llama):
    from adaflash.serve.connections import ConnectionLimits

    running = _start(tiny_llama, limits=ConnectionLimits(header_timeout=0.3, keepalive_timeout=0.3, body_timeout=0.5))
    engine = running.server.engine
    real = engine.step

    def slow_step():
        time.sleep(0.2)
        return real()

    engine.step = slow_step
    host, port = running.url.removeprefix("http://").split(":")

    async def long_answer() -> dict:
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
        async with aiohttp.ClientSession() as session, session.post(running.url + "/generate", json=body) as r:
            assert r.status == 200
            return await r.json()

    try:
        out = asyncio.run(long_answer())  # about 1.2 s, four times the idle deadlines
        assert out["meta_info"]["completion_tokens"] == 6
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"text\": ")
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"did not arrive within 0.5 s" in reply
    finally:
        running.stop()


async def test_a_big_request_whose_client_leaves_frees_its_waiting_prompts(tiny_llama):
    running = _start(tiny_llama, max_batch=2)
    big = {"text": [f"Story number {i}" for i in range(400)],
           "sampling_params": {"max_new_tokens": 128, "temperature": 0, "ignore_eos": True}}

    async def info(session: aiohttp.ClientSession) -> dict:
        async with session.get(running.url + "/get_server_info") as response:
            return await response.json()

    try:
        async with aiohttp.ClientSession() as session:
            leaving = asyncio.ensure_future(session.post(running.url + "/generate", json=big))
            for _ in range(200):
                if (await info(session))["queue_depth"] > 0:
                    break
                await asyncio.sleep(0.01)
            leaving.cancel()
            for _ in range(200):
                state = await info(session)
                if state["queue_depth"] == 0 and state["running_requests"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert state["queue_depth"] == 0 and state["running_requests"] == 0, state
            assert state["requests_served"] < 400
    finally:
        running.stop()


def test_running_out_of_file_descriptors_is_one_line_a_minute(capsys):
    import errno

    from adaflash.serve.connections import ConnectionLimits, QuietAcceptErrors, connection_cap

    loop = asyncio.new_event_loop()
    try:
        quiet = QuietAcceptErrors(loop)
        passed_on = []
        quiet.previous = lambda _loop, context: passed_on.append(context["message"])
        for _ in range(500):
            quiet(loop, {"message": "socket.accept() out of system resource",
                         "exception": OSError(errno.EMFILE, "Too many open files")})
        quiet(loop, {"message": "something else"})
    finally:
        loop.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "out of file descriptors" in lines[0]
    assert quiet.suppressed == 499 and passed_on == ["something else"]
    assert connection_cap(ConnectionLimits(), 4096) == 4096 - 512
    assert connection_cap(ConnectionLimits(max_connections=100), 4096) == 100
    assert connection_cap(ConnectionLimits(max_connections=10**6), 4096) == 4096 - 512
    with pytest.raises(ValueError, match="header_timeout"):
        ConnectionLimits(header_timeout=0)
