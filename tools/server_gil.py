"""A server's throughput against its own engine's, with the device replaced by a clock: what the interpreter
lock costs a server whose GPU step takes GPU_MS. A launch returns at once, as a CUDA launch does, and reading
its tokens waits until GPU_MS after the device's earlier work (the lock free, as while `tolist()` waits for a
real step); the server is `adaflash serve`'s, in this
process, and `adaflash bench --stream` drives it from another at concurrency BATCH, each pinned to a core of its
own where there are two. Runs on a CPU; a busy or shared machine gives noisy throughputs, and the event loop's
CPU time a streamed token (sockets included) is the steadier figure.
Usage: server_gil.py [GPU_MS] [BATCH] [TARGET] [WAVES] [MODE] (a small model folder, e.g. `adaflash models synth
qwen3-tiny`; MODE: thread, the engine on a thread of the server's process, or process, in a process of its own as
`adaflash serve` runs it, that process on the first core and the server's with the client on the second)."""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from adaflash.bench.metrics import passes_text
from adaflash.engine.build import build_engine
from adaflash.engine.config import EngineConfig
from adaflash.engine.params import Request, SamplingParams
from adaflash.serve.engine_process import EngineProcess, EngineSpec
from adaflash.serve.running import RunningServer
from adaflash.serve.server import EmbeddedServer

CORES = sorted(os.sched_getaffinity(0))
CLIENT_CORE = ["taskset", "-c", str(CORES[1])] if len(CORES) > 1 and shutil.which("taskset") else []
PREFILL_STEPS = 2.0  # a prefill pass's device time, in decode steps
NEW_TOKENS = 256  # at most; a row ends with the eos token at each step with chance 1/128, as answers end at different steps


def stub_engine(target: str, batch: int, gpu_ms: float):
    """A GPU as the host sees it: a launch returns at once and queues GPU_MS of device work after the work
    already queued; reading a step's tokens waits, the lock free, until that work is done."""
    engine = build_engine(target, "vanilla", config=EngineConfig(max_batch=batch, max_len=1024, overlap=True,
                                                                 pad_shapes=True), device="cpu", dtype="float32")
    passes, vocab = engine.passes, engine.model.cfg.vocab_size
    eos = engine.target.ensure_tokenizer() and engine.target.eos_ids[0]
    draws = torch.Generator().manual_seed(0)
    device_free, done_at = [0.0], {}

    def stub_step(rows_p, block_p, lens_p, verify_n_p, verified=0):
        rows = rows_p.shape[0]  # each row: accepted, verified, its token (7, or the eos token)
        ends = torch.rand(rows, generator=draws) < 1 / 128
        packed = torch.stack([torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long),
                              torch.where(ends, eos, 7)], dim=1)
        device_free[0] = max(time.perf_counter(), device_free[0]) + gpu_ms / 1e3
        done_at[id(packed)] = device_free[0]
        return packed

    land = engine._land

    def land_when_done():
        flight = engine._flight
        if flight is not None:
            time.sleep(max(0.0, done_at.pop(id(flight.packed), 0.0) - time.perf_counter()))
        return land()

    engine._land = land_when_done
    passes._greedy_step_fn = lambda kv: stub_step
    def stub_prefill(ids, rows, length):
        """A prefill pass as the host sees one: read at once (its first tokens), after the device's earlier
        work and PREFILL_STEPS of its own (a SmolLM2 admission on an H100 took one to three decode steps)."""
        device_free[0] = max(time.perf_counter(), device_free[0]) + PREFILL_STEPS * gpu_ms / 1e3
        time.sleep(max(0.0, device_free[0] - time.perf_counter()))
        return torch.zeros(ids.shape[0], vocab)

    passes.prefill = stub_prefill
    return engine


@dataclass(frozen=True)
class StubSpec(EngineSpec):
    """The engine process's build: the stubbed engine of `stub_engine`."""

    gpu_ms: float = 1.5

    def build(self):
        return stub_engine(self.target, self.config.max_batch, self.gpu_ms)


def served_by_process(target: str, prompts: int, batch: int, gpu_ms: float) -> float:
    """`server_tok_s` with the engine in a process of its own (`adaflash serve`'s way)."""
    config = EngineConfig(max_batch=batch, max_len=1024)
    process = EngineProcess(StubSpec(target, "vanilla", None, config, "cpu", "float32", gpu_ms=gpu_ms))
    facts = process.start_engine()  # the child inherits this process's core
    if CLIENT_CORE:
        os.sched_setaffinity(0, {CORES[1]})  # the server's process beside the client, the engine alone
    running = RunningServer(EmbeddedServer(facts, target=target, engine_process=process))
    try:
        result = run_client(running.url, target, prompts, batch)
    finally:
        running.stop()
    print(f"server (engine process): median TPOT {result['median_tpot_ms']:.2f} ms, mean TTFT "
          f"{result['mean_ttft_ms']:.1f} ms")
    loop = result.get("engine_loop") or {}
    if loop.get("steps"):
        print(f"server (engine process): {loop['steps']} steps, {loop['rows_per_step']:.1f} rows a step, "
              f"{loop['step_ms']:.2f} ms a step inside engine.step, {loop['between_ms']:.3f} ms between steps; "
              f"passes: {passes_text(result.get('passes') or {})}")
    return result["output_throughput"]


def run_client(url: str, target: str, prompts: int, batch: int) -> dict:
    """`adaflash bench --stream` at concurrency BATCH on its own core: its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "p.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} + {i}?"}) + "\n"
                                for i in range(prompts)))
        out = subprocess.run([*CLIENT_CORE, sys.executable, "-m", "adaflash.cli.main", "bench", "--base-url", url,
                              "--dataset", str(data), "--num-prompts", str(prompts), "--concurrency", str(batch),
                              "--max-new-tokens", str(NEW_TOKENS), "--no-chat", "--warmup", "0",
                              "--target", target, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def engine_tok_s(engine, prompts: int) -> float:
    for i in range(prompts):
        engine.add(Request(prompt_ids=[5] * 40, params=SamplingParams(max_new_tokens=NEW_TOKENS),
                           rid=str(i)))
    started, tokens, steps, rows = time.perf_counter(), 0, 0, 0
    while engine.has_work():
        rows += len(engine.active)
        tokens += sum(len(event.new_ids) for event in engine.step())
        steps += 1
    seconds = time.perf_counter() - started
    print(f"engine: {steps} steps, {seconds / steps * 1e3:.2f} ms a step, {rows / steps:.1f} rows a step")
    return tokens / seconds


def server_tok_s(engine, target: str, prompts: int, batch: int) -> float:
    busy, step = [0.0, 0, 0], engine.step

    def timed_step():
        busy[2] += len(engine.active)
        started = time.perf_counter()
        events = step()
        busy[0] += time.perf_counter() - started
        busy[1] += 1
        return events

    engine.step = timed_step
    server = EmbeddedServer(engine, target=target)
    handed, queued, submit, add = {}, {}, server.submit, engine.add

    async def timed_submit(items, arrived, **kwargs):  # when each request's handler began
        handles = await submit(items, arrived, **kwargs)
        handed.update((handle.rid, arrived) for handle in handles)
        return handles

    def timed_add(request):  # when it entered the engine's queue
        queued[request.rid] = time.perf_counter()
        return add(request)

    server.submit, engine.add = timed_submit, timed_add
    running = RunningServer(server)
    http_cpu = time.pthread_getcpuclockid(running._thread.ident)  # the event loop's thread: CPU time, not wall
    http_started = time.clock_gettime(http_cpu)
    try:
        result = run_client(running.url, target, prompts, batch)
        http_seconds = time.clock_gettime(http_cpu) - http_started
        client = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        running.stop()
    print(f"client: {client.ru_utime + client.ru_stime:.2f} s of CPU over its {result['duration']:.2f} s of requests "
          "(its start included)")
    print(f"server: its event loop's thread spent {http_seconds / result['total_output_tokens'] * 1e6:.1f} us of "
          "CPU a streamed token (sockets, HTTP and requests included)")
    print(f"server: {busy[1]} steps, {busy[0] / busy[1] * 1e3:.2f} ms a step inside engine.step, "
          f"{busy[2] / busy[1]:.1f} rows a step, {result['duration'] - busy[0]:.2f} s of {result['duration']:.2f} outside it; median TPOT "
          f"{result['median_tpot_ms']:.2f} ms, mean TTFT {result['mean_ttft_ms']:.1f} ms")
    way_in = sorted(queued[rid] - handed[rid] for rid in handed if rid in queued)
    print(f"server: from a request's handler to the engine's queue {way_in[len(way_in) // 2] * 1e3:.2f} ms (median), "
          f"{way_in[int(len(way_in) * 0.9)] * 1e3:.2f} ms (p90)")
    return result["output_throughput"]


if __name__ == "__main__":
    gpu_ms = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    target = sys.argv[3] if len(sys.argv) > 3 else "synth/qwen3-tiny"
    prompts = batch * (int(sys.argv[4]) if len(sys.argv) > 4 else 4)
    if CLIENT_CORE:
        os.sched_setaffinity(0, {CORES[0]})
    mode = sys.argv[5] if len(sys.argv) > 5 else "thread"
    alone = engine_tok_s(stub_engine(target, batch, gpu_ms), prompts)
    if mode == "process":
        served = served_by_process(target, prompts, batch, gpu_ms)
    else:
        served = server_tok_s(stub_engine(target, batch, gpu_ms), target, prompts, batch)
    print(f"step {gpu_ms} ms, batch {batch}: engine {alone:,.0f} tok/s, server {served:,.0f} tok/s "
          f"({served / alone:.0%})")
