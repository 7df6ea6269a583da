"""The engine in a process of its own (`adaflash serve`'s): what the server does when that process cannot
start, dies mid-answer, or is stopped. Its answers, streams, swaps and aborts are test_serve_server.py's, which
runs every server test in both modes."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import aiohttp
import pytest

from adaflash.engine.config import EngineConfig
from adaflash.serve.engine_process import EngineProcess, EngineSpec, EngineStartError


def _spec(tiny_llama, **kw) -> EngineSpec:
    fields = {"target": str(tiny_llama), "method": "vanilla", "draft": None,
              "config": EngineConfig(max_batch=4, max_len=4096), "device": "cpu", "dtype": None, **kw}
    return EngineSpec(**fields)


def test_an_engine_that_cannot_build_says_why_and_leaves_no_process(tiny_llama, tmp_path):
    process = EngineProcess(_spec(tiny_llama, method="dflash", draft=str(tmp_path / "no-drafter")))
    with pytest.raises(EngineStartError, match="no-drafter"):
        process.start_engine()
    process.process.join(10)
    assert not process.process.is_alive()


def test_the_server_mirrors_the_engines_facts(tiny_llama, tiny_target):
    from adaflash.engine.build import build_engine
    from adaflash.serve.engine_process import EngineFacts

    process = EngineProcess(_spec(tiny_llama))
    try:
        facts = process.start_engine()
    finally:
        process.stop()
    here = EngineFacts.of(build_engine(str(tiny_llama), "vanilla", config=_spec(tiny_llama).config, device="cpu"))
    assert (facts.method, facts.max_len, facts.max_batch, facts.context_margin, facts.model.cfg, facts.folder) == \
        (here.method, here.max_len, here.max_batch, here.context_margin, here.model.cfg, here.folder)
    assert facts.target is not None and facts.target.encode("Hello there") == tiny_target.encode("Hello there")


def test_a_killed_engine_fails_its_requests_and_the_health_check(tiny_llama):
    """Killed mid-answer (out of memory, say): the request in flight gets a 500 that says so, /health a 503,
    and a new request a 503; stopping the server afterwards still returns."""
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    process = EngineProcess(_spec(tiny_llama))
    running = RunningServer(EmbeddedServer(process.start_engine(), target=str(tiny_llama), engine_process=process))
    long = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}

    async def check() -> None:
        async with aiohttp.ClientSession() as session:
            answer = asyncio.ensure_future(session.post(running.url + "/generate", json=long))
            for _ in range(200):  # until it decodes
                async with session.get(running.url + "/get_server_info") as r:
                    if (await r.json())["running_requests"]:
                        break
                await asyncio.sleep(0.02)
            os.kill(process.process.pid, signal.SIGKILL)
            response = await answer
            assert response.status == 500
            assert "engine process exited" in (await response.json())["error"]["message"]
            async with session.get(running.url + "/health") as r:
                assert r.status == 503
            async with session.post(running.url + "/generate", json={"text": "Hi"}) as r:
                assert r.status == 503 and "not running" in json.loads(await r.text())["error"]["message"]

    try:
        asyncio.run(check())
    finally:
        running.stop()
    assert not process.process.is_alive()


def test_stopping_the_server_stops_its_engine_process(tiny_llama):
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    process = EngineProcess(_spec(tiny_llama))
    running = RunningServer(EmbeddedServer(process.start_engine(), target=str(tiny_llama), engine_process=process))
    assert process.alive
    running.stop()
    assert not process.process.is_alive() and process.process.exitcode == 0


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_adaflash_serve_leaves_no_engine_process_behind(tiny_llama, tmp_path, how):
    """`adaflash serve` stopped (SIGTERM: the engine process is told to stop) or killed (SIGKILL: the engine
    process sees its pipe close and exits): either way no engine holds the device afterwards."""
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "adaflash.cli.main", "--workspace", str(tmp_path), "serve", "--target", str(tiny_llama),
         "--port", "0", "--device", "cpu", "--max-batch", "2", "--context-length", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert "ready on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        engines = [child for child in psutil.Process(proc.pid).children(recursive=True)
                   if "spawn_main" in " ".join(child.cmdline())]
        assert len(engines) == 1
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        proc.wait(60)
        deadline = time.monotonic() + 30
        while engines[0].is_running() and engines[0].status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engines[0].is_running() or engines[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "sigterm":
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
