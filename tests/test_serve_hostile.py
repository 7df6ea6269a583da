"""The embedded server against a hostile tester's requests: malformed HTTP (raw sockets), bodies that do
not decode, sizes refused from the head, stop ids off the vocabulary, error `param`s, auth schemes,
and the speculation counters and connection gauge of /metrics.

Every refusal must be a JSON error in the documented shape, logged as one line, with no traceback."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig
from tests.processes import stop_with_sigterm

pytestmark = pytest.mark.xdist_group("test_serve_hostile")

SOCKET_TIMEOUT = 10.0
BODY = b'{"text": "hi", "sampling_params": {"max_new_tokens": 2}}'
HEAD = b"Host: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"


def _post(extra: bytes = b"", body: bytes = BODY, *, length: bool = True) -> bytes:
    declared = b"Content-Length: %d\r\n" % len(body) if length else b""
    return b"POST /generate HTTP/1.1\r\n" + HEAD + declared + extra + b"\r\n" + body


def _get(extra: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\n" + HEAD + extra + b"\r\n"


# (name, raw bytes, expected statuses, a fragment of the error message)
MALFORMED = [
    ("method FOO", b"FOO /health HTTP/1.1\r\n" + HEAD + b"\r\n", {400}, "not an HTTP/1.x request"),
    ("100 KB URL", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n" + HEAD + b"\r\n", {400}, "longer than"),
    ("100 KB header", _get(b"X-Big: " + b"a" * 100_000 + b"\r\n"), {400}, "longer than"),
    ("duplicate Content-Length", _post(b"Content-Length: %d\r\n" % len(BODY)), {400}, "Duplicate Content-Length"),
    ("negative Content-Length", _post(b"Content-Length: -1\r\n", length=False), {400}, "Content-Length"),
    ("2^70 Content-Length", _post(b"Content-Length: %d\r\n" % 2**70, length=False), {400}, "Content-Length"),
    ("Content-Length with Transfer-Encoding", _post(b"Transfer-Encoding: chunked\r\n"), {400}, "Transfer-Encoding"),
    ("NUL in a header value", _get(b"X-A: a\x00b\r\n"), {400}, "malformed HTTP request"),
    ("NUL in a header name", _get(b"X-\x00A: b\r\n"), {400}, "malformed HTTP request"),
    ("0xFF in a header name", _get(b"X-\xffA: b\r\n"), {400}, "malformed HTTP request"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400}, "HTTP/2"),
    ("TLS client hello", bytes.fromhex("16030100a5010000a10303") + b"\x00" * 40, {400}, "TLS"),
    ("bad chunk size", b"POST /generate HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
     {400}, "chunk"),
    ("gzip body that is not gzip", _post(b"Content-Encoding: gzip\r\n", b"not gzip at all"), {400}, "gzip"),
    ("deflate body that is not deflate", _post(b"Content-Encoding: deflate\r\n", b"not deflate"), {400}, "deflate"),
    # 415 where the Brotli package is missing (the coding cannot be decoded at all), else a 400
    ("brotli body that is not brotli", _post(b"Content-Encoding: br\r\n", b"not brotli"), {400, 415}, "ncoding"),
    ("Content-Length: 100 MB", _post(b"Content-Length: 100000000\r\n", b"{", length=False), {413}, "over the server"),
]


def _start(tiny_llama: Path, drafter: Path, **kw):
    from adaflash.engine.build import build_engine
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    engine = build_engine(str(tiny_llama), "dflash", str(drafter), config=EngineConfig(max_batch=4, max_len=256),
                          device="cpu")
    return RunningServer(EmbeddedServer(engine, target="tiny", draft=str(drafter), **kw))


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tiny_target) -> Path:
    from adaflash.models.drafter_io import new_drafter, save_drafter

    return save_drafter(new_drafter("dflash", tiny_target.model.cfg, seed=1), tmp_path_factory.mktemp("d") / "draft")


@pytest.fixture(scope="module")
def server(tiny_llama, drafter_dir):
    running = _start(tiny_llama, drafter_dir, max_new_tokens_limit=64)
    yield running
    running.stop()


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response off `sock`: status, headers (lower-case names) and the body its Content-Length gives."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a whole response head: {data[:200]!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split(" ")[1]), headers, rest[:length]


def _exchange(url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` on a fresh connection; the response it gets."""
    with socket.create_connection(_address(url), timeout=SOCKET_TIMEOUT) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # answered and closed before it all went
            sock.sendall(raw)
        return _read_response(sock)


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def _assert_json_error(status: int, headers: dict[str, str], body: bytes, fragment: str) -> dict:
    assert headers["content-type"].startswith("application/json"), (status, headers, body[:300])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, error
    assert fragment in error["message"], error
    return error


@pytest.mark.parametrize(("name", "raw", "statuses", "fragment"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_http_gets_a_json_error_and_one_log_line(server, caplog, capsys, name, raw, statuses, fragment):
    caplog.clear()
    started = time.perf_counter()
    status, headers, body = _exchange(server.url, raw)
    assert time.perf_counter() - started < 5, "answered from the head, not after a body timeout"
    assert status in statuses, (name, status, body[:300])
    _assert_json_error(status, headers, body, fragment)
    records = _warnings(caplog)
    assert len(records) <= 1 and not any(r.exc_info for r in caplog.records), [r.getMessage() for r in records]
    if status != 413:  # a refused size is an answer, not a malformed request
        assert len(records) == 1 and "\n" not in records[0].getMessage(), [r.getMessage() for r in records]
    assert "Traceback" not in capsys.readouterr().err


def test_a_second_malformed_request_on_a_keep_alive_connection(server, caplog):
    with socket.create_connection(_address(server.url), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == 200
        sock.sendall(b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n")
        second = _read_response(sock)
    assert second[0] == 400
    _assert_json_error(*second, "not an HTTP/1.x request")
    assert len(_warnings(caplog)) == 1 and not any(r.exc_info for r in caplog.records)


def test_documented_200s_obs_text_header_and_good_gzip(server):
    status, _, _ = _exchange(server.url, _get(b"X-A: caf\xe9 \xff\r\n"))
    assert status == 200  # bytes 0x80-0xFF in a header value are obs-text (RFC 9110): accepted
    status, _, body = _exchange(server.url, _post(b"Content-Encoding: gzip\r\n", gzip.compress(BODY)))
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 2


def test_a_client_leaving_mid_body_logs_no_traceback(server, caplog, capsys):
    with socket.create_connection(_address(server.url), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\n" + HEAD + b"Content-Length: 1000\r\n\r\n{\"text\": ")
        time.sleep(0.2)
    time.sleep(0.3)
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in capsys.readouterr().err
    status, _, _ = _exchange(server.url, _get(b""))
    assert status == 200


async def _call(url: str, body: object = None, *, method: str = "POST",
                headers: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.request(method, url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize("stop_ids", [[-1], [2**70], [10**9], [1, 49152]])
async def test_stop_token_ids_off_the_vocabulary_are_refused(server, stop_ids):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "stop_token_ids": stop_ids}}
    status, out = await _call(server.url + "/generate", body)
    assert status == 400, out
    assert out["error"]["param"] == "sampling_params.stop_token_ids"
    assert "[0, 49152)" in out["error"]["message"]


async def test_stop_token_ids_in_the_vocabulary_are_served(server):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "stop_token_ids": [0, 49151]}}
    status, out = await _call(server.url + "/generate", body)
    assert status == 200, out


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/generate", {"text": "x" * 10_000_000}, "text"),
    ("/generate", {"text": ["ok", "x" * 100_000]}, "text"),
    ("/v1/completions", {"prompt": "x" * 10_000_000}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 10_000_000}]}, "messages"),
])
async def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(server, monkeypatch, path, body, param):
    def never(_items):
        raise AssertionError("a prompt that cannot fit was tokenized")

    monkeypatch.setattr(server.server, "_encode", never)
    started = time.perf_counter()
    status, out = await _call(server.url + path, body)
    assert status == 400, out
    assert out["error"]["param"] == param and "more than fit the context of 256 tokens" in out["error"]["message"]
    assert time.perf_counter() - started < 3


def test_the_prompt_bound_never_refuses_a_prompt_that_fits(server):
    """The bound holds because no token stands for more characters than the longest vocabulary entry:
    a text of N characters has at least N / longest tokens, so one over context × longest cannot fit."""
    srv = server.server
    longest = max(len(entry) for entry in srv.encoder.tokenizer.get_vocab())
    assert srv.max_prompt_chars == srv.engine.max_len * longest  # this tokenizer has no normalizer
    texts = [" " * 5000, "#" * 5000, "\n" + " " * 4000, "=" * 3000, "ab" * 2000, "caf\u00e9 \U0001f600" * 300,
             "def f():\n" + "    return 1\n" * 200, "\u00e9" * 1000 + "e\u0301" * 1000]
    for text in texts:
        assert len(text) <= len(srv.encoder.encode(text)) * longest, text[:40]


@pytest.mark.parametrize(("field", "value"), [
    ("suffix", "abc"), ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("response_format", {"type": "json_object"}),
])
async def test_an_unsupported_field_error_names_the_field_in_param(server, field, value):
    status, out = await _call(server.url + "/v1/completions", {"prompt": "hi", field: value})
    assert status == 400 and out["error"]["param"] == field, out
    status, out = await _call(server.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}], field: value})
    assert status == 400 and out["error"]["param"] == field, out


async def test_native_unknown_and_unsupported_fields_name_the_field(server):
    status, out = await _call(server.url + "/generate", {"text": "hi", "lora_path": "'x'"})
    assert status == 400 and out["error"]["param"] == "lora_path", out
    status, out = await _call(server.url + "/generate", {"text": "hi", "bogus": "'x'"})
    assert status == 400 and out["error"]["param"] == "bogus", out


async def test_models_with_a_trailing_slash(server):
    plain = await _call(server.url + "/v1/models", method="GET")
    slash = await _call(server.url + "/v1/models/", method="GET")
    assert plain[0] == slash[0] == 200 and slash[1]["data"] == plain[1]["data"]


@pytest.mark.parametrize(("header", "status"), [
    ("Bearer k3y", 200), ("bearer k3y", 200), ("BEARER  k3y", 200), ("Basic k3y", 401), ("bearer nope", 401),
    ("k3y", 401), ("bearer", 401),
])
async def test_the_auth_scheme_is_case_insensitive(server, monkeypatch, header, status):
    monkeypatch.setattr(server.server, "api_key", "k3y")
    got, out = await _call(server.url + "/v1/models", method="GET", headers={"Authorization": header})
    assert got == status, out
    if status == 401:
        assert out["error"]["type"] == "Unauthorized"


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


async def test_metrics_count_draft_and_accepted_tokens(server):
    async def scrape() -> str:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/metrics") as r:
            return await r.text()

    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total")
    before = {n: _metric(await scrape(), n) for n in names}
    body = {"text": ["Hello there", "Count to five"],
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    status, outs = await _call(server.url + "/generate", body)
    assert status == 200, outs
    text = await scrape()
    metas = [o["meta_info"] for o in outs]
    drafted = sum(m["spec_num_proposed_drafts"] for m in metas)
    accepted = sum(m["spec_num_correct_drafts"] for m in metas)
    steps = sum(sum(m["spec_accept_histogram"]) for m in metas)
    assert drafted > 0 and steps > 0
    assert _metric(text, names[0]) - before[names[0]] == steps
    assert _metric(text, names[1]) - before[names[1]] == drafted
    assert _metric(text, names[2]) - before[names[2]] == accepted
    rate = _metric(text, "sglang:spec_accept_rate")
    assert rate == pytest.approx(_metric(text, names[2]) / _metric(text, names[1]))


async def test_open_connections_is_current_at_scrape_time(server):
    async def gauge() -> float:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/metrics") as r:
            return _metric(await r.text(), "adaflash:open_connections")

    baseline = await gauge()
    held = []
    for _ in range(5):
        sock = socket.create_connection(_address(server.url), timeout=SOCKET_TIMEOUT)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == 200
        held.append(sock)
    assert await gauge() >= baseline + 5
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 3  # the keep-alive deadline is 30 s: a count that waits for it fails
    while await gauge() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert await gauge() <= baseline


@pytest.mark.skipif(sys.platform != "linux", reason="reads a subprocess's stderr")
def test_the_cli_server_logs_one_line_per_malformed_request_and_no_traceback(tiny_llama, workspace):
    """`adaflash serve` itself, as the tester ran it: its stderr after every malformed request."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaflash.cli.main", "serve", "--target", str(tiny_llama), "--port", "0",
         "--device", "cpu", "--max-batch", "2", "--context-length", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert "ready on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.strip().rsplit(" ", 1)[1]
        for name, raw, statuses, _ in MALFORMED:
            status, headers, _ = _exchange(url, raw)
            assert status in statuses and headers["content-type"].startswith("application/json"), name
    finally:
        err = stop_with_sigterm(proc, timeout=60)
    assert "Traceback" not in err, err[-3000:]
    refused = [line for line in err.splitlines() if line.startswith("adaflash serve: refused")]
    assert len(refused) == len(MALFORMED) - 1, err[-3000:]  # the 413 is an answer, not a malformed request
