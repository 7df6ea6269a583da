"""Running an EmbeddedServer: until an event is set (`adaflash serve`), or on a thread of its own (tests)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web

from adaflash.serve.server import EmbeddedServer


async def serve(server: EmbeddedServer, host: str, port: int, stop: asyncio.Event,
                ready: Callable[[str], None] | None = None) -> None:
    """Serve until `stop` is set; `ready(url)` once the socket listens and the engine thread runs."""
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its requests.
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=5.0, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        if ready is not None:
            ready(f"http://{host}:{bound}")
        await stop.wait()
    finally:
        await runner.cleanup()


class RunningServer:
    """A server on its own event-loop thread (tests)."""

    def __init__(self, server: EmbeddedServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(host, port), name="adaflash-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the server did not start within 60 s")
        if self._error is not None:
            raise self._error

    def _run(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()

        def ready(url: str) -> None:
            self.url = url
            self._ready.set()

        try:
            self._loop.run_until_complete(serve(self.server, host, port, self._stop, ready))
        except BaseException as err:  # surface bind errors to the constructor
            self._error = err
            self._ready.set()
        finally:
            self._loop.close()

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
