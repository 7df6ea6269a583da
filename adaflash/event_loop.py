"""The event loop the server and the benchmark client run on: uvloop's where it is installed.

Why: a streaming server spends most of its CPU in the event loop's transports, one socket write a chunk
a stream, and at tens of thousands of tokens a second that one thread is what the server's throughput
waits on; uvloop's transports (libuv, in C) cost a fraction of asyncio's pure-Python ones, as SGLang and
vLLM found for their servers. `ADAFLASH_EVENT_LOOP=asyncio` asks for the standard loop (to compare them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop() -> Any | None:
    if os.environ.get("ADAFLASH_EVENT_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # not on this platform (Windows), or not installed
        return None
    return uvloop


def name() -> str:
    """"uvloop" or "asyncio": the loop `run` and `new_loop` give, for the run log."""
    return "uvloop" if _uvloop() is not None else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the chosen loop."""
    uvloop = _uvloop()
    return uvloop.run(main) if uvloop is not None else asyncio.run(main)


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop of the chosen kind, for a thread that runs its own."""
    uvloop = _uvloop()
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
