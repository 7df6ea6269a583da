"""CPU time a streaming server spends per chunk: 64 streams of `adaflash serve` fed one token a step, each
chunk built (text so far, JSON, metrics) and written to a response that discards it. Usage:
stream_chunk_cost.py [TARGET] (default: the built-in target's folder)."""

import asyncio
import sys
import time

from adaflash.engine.engine import StepEvent
from adaflash.models.loading import load_target
from adaflash.models.registry import builtin_folder
from adaflash.serve.engine_loop import Handle, Mailbox
from adaflash.serve.event_stream import EventStream
from adaflash.serve.metrics import ServerMetrics
from adaflash.serve.server import EmbeddedServer

TEXT = "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May. "


class _Discard:
    async def write(self, _data: bytes) -> None:
        return None


def chunk_server(target) -> EmbeddedServer:
    """The server's streaming half alone: its text, metrics and chunks, no engine thread or sockets."""
    server = EmbeddedServer.__new__(EmbeddedServer)
    server.text, server.adapter, server.metrics = target, None, ServerMetrics("m", dict)
    return server


async def us_a_chunk(target, steps: int = 128, streams: int = 64) -> float:
    server, ids = chunk_server(target), target.encode(TEXT * 4)
    handles = [Handle(str(i), Mailbox(), time.perf_counter(), 100) for i in range(streams)]

    async def pump(handle: Handle, out: EventStream) -> None:
        while await server.update(handle) is None:
            await out.send(server._partial(handle))

    tasks = [asyncio.ensure_future(pump(h, EventStream(_Discard()))) for h in handles]
    await asyncio.sleep(0)
    started = time.perf_counter()
    for step in range(steps):
        for handle in handles:
            handle.queue.put_nowait(StepEvent(handle.rid, [ids[step % len(ids)]]))
        while any(not handle.queue.empty() for handle in handles):
            await asyncio.sleep(0)
    seconds = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    return seconds / (steps * streams) * 1e6


if __name__ == "__main__":
    loaded = load_target(sys.argv[1] if len(sys.argv) > 1 else str(builtin_folder("smollm2-135m")), device="cpu")
    print(f"{min(asyncio.run(us_a_chunk(loaded)) for _ in range(5)):.2f} us of CPU a streamed chunk (64 streams)")
