"""Running an EmbeddedServer: until an event is set (`adaflash serve`), or on a thread of its own (tests)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

from aiohttp import web

from adaflash.serve.connections import ConnectionGuard, QuietAcceptErrors, connection_cap, raise_fd_limit
from adaflash.serve.http_handler import handler_factory
from adaflash.serve.server import EmbeddedServer

ACCEPT_BURST = 128  # asyncio accepts up to this many sockets per wake-up, before the guard sees any
KERNEL_BACKLOG = 4096  # connections the kernel queues for accept (a short queue makes clients retry after 1 s)


async def serve(server: EmbeddedServer, host: str, port: int, stop: asyncio.Event,
                ready: Callable[[str], None] | None = None) -> None:
    """Serve until `stop` is set; `ready(url)` once the socket listens and the engine thread runs.

    The listening socket's protocol factory is a `ConnectionGuard` (deadlines and a cap on idle
    connections, `connections.py`) around aiohttp's handlers with JSON parser errors (`http_handler.py`)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(QuietAcceptErrors(loop))
    limits = server.limits
    handler_options = {"access_log": None, "keepalive_timeout": limits.keepalive_timeout + limits.header_timeout}
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its requests.
    runner = web.AppRunner(server.app(), shutdown_timeout=5.0, handler_cancellation=True, **handler_options)
    await runner.setup()
    listening = None
    try:
        assert runner.server is not None
        server.guard = ConnectionGuard(handler_factory(runner.server, **handler_options), limits,
                                       connection_cap(limits, raise_fd_limit()))
        sock = _listening_socket(host, port)
        listening = await loop.create_server(server.guard, sock=sock, backlog=ACCEPT_BURST)
        sock.listen(KERNEL_BACKLOG)  # asyncio listened with its burst size; the kernel may queue more
        bound = sock.getsockname()[1]
        if ready is not None:
            ready(f"http://{host}:{bound}")
        await stop.wait()
    finally:
        if listening is not None:
            listening.close()
        await runner.cleanup()
        loop.set_exception_handler(previous)


def _listening_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


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
