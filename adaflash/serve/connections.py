"""Keeping idle connections from taking the server down.

Why: every open connection costs a file descriptor, and a client (or thousands) that connects and
then sends its request head slowly, or never, holds one forever. Once the process runs out of file
descriptors nothing works any more: `/health` cannot be accepted, the run log cannot be opened, and
asyncio logs a traceback per refused accept. So:

- a connection must send a whole request head within `header_timeout` seconds of connecting;
- a keep-alive connection idle for `keepalive_timeout` seconds after its last response is closed;
- at most `max_connections` are open: when one more arrives, the oldest idle ones are closed to make
  room (a connection inside a request is never closed), so a fresh client always gets in;
- the soft file-descriptor limit is raised to the hard one, and `max_connections` stays below it.

`ConnectionGuard` is the protocol factory of the listening socket: it wraps aiohttp's and tracks
which connections are inside a request through `mark_busy`/`mark_idle`, which the server's first
middleware calls (`request.protocol` is the connection). Its handlers report their connection's end
(`http_handler.JsonRequestHandler.on_lost`), so `count` is the connections open now, not those open
when their last deadline was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("adaflash.serve")

RESERVED_FDS = 512  # kept for files, the run log, model loads, and a burst of accepts (running.ACCEPT_BURST)
EVICT_FRACTION = 0.02  # share of the cap closed at once when it is reached (amortizes the scan)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0  # seconds from connecting to a complete request head
    keepalive_timeout: float = 30.0  # seconds a keep-alive connection may idle between requests
    max_connections: int | None = None  # None: what the file-descriptor limit allows
    body_timeout: float = 60.0  # seconds to receive a request body once its head arrived

    def __post_init__(self) -> None:
        for name in ("header_timeout", "keepalive_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections!r}")


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as SGLang does); the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_cap(limits: ConnectionLimits, fd_limit: int) -> int:
    """The most connections served at once: the asked-for cap, kept below the file-descriptor limit."""
    room = max(fd_limit - RESERVED_FDS, 16)
    return min(limits.max_connections or room, room)


class ConnectionGuard:
    """The listening socket's protocol factory: aiohttp's handlers, with deadlines and a cap."""

    def __init__(self, factory: Callable[[], Any], limits: ConnectionLimits, cap: int) -> None:
        self.factory = factory
        self.limits = limits
        self.cap = cap
        self.loop = asyncio.get_running_loop()
        self.open: OrderedDict[Any, None] = OrderedDict()  # oldest first
        self.busy: dict[Any, int] = {}
        self.started: dict[Any, int] = {}  # requests begun on each connection
        self.made: set[Any] = set()  # handlers whose connection_made ran (asyncio calls it a loop turn later)
        self.evicted = 0
        self.timed_out = 0

    def __call__(self) -> Any:
        if len(self.open) >= self.cap:
            self._make_room()
        handler = self.factory()
        if hasattr(handler, "on_lost"):  # a JsonRequestHandler: forgotten the moment its connection closes
            handler.on_lost = self._drop
        self.open[handler] = None
        self.started[handler] = 0
        self._arm(handler, self.limits.header_timeout)
        return handler

    @property
    def count(self) -> int:
        """Connections open now (after dropping those the peer closed)."""
        self._forget_closed()
        return len(self.open)

    # -- called by the server's middleware ----------------------------------------------------------
    def mark_busy(self, handler: Any) -> None:
        self.busy[handler] = self.busy.get(handler, 0) + 1
        if handler in self.started:
            self.started[handler] += 1

    def mark_idle(self, handler: Any) -> None:
        left = self.busy.get(handler, 1) - 1
        if left > 0:
            self.busy[handler] = left
            return
        self.busy.pop(handler, None)
        if handler in self.open:
            self._arm(handler, self.limits.keepalive_timeout)

    # -- internals ------------------------------------------------------------------------------------
    def _arm(self, handler: Any, seconds: float) -> None:
        """Close `handler` in `seconds` unless a request starts on it before then."""
        self.loop.call_later(seconds, self._expire, handler, self.started.get(handler, 0))

    def _expire(self, handler: Any, seen: int) -> None:
        if handler not in self.open:
            return
        if self._closed(handler):
            self._drop(handler)
        elif self.started.get(handler) == seen and handler not in self.busy:
            self.timed_out += 1
            self._close(handler)

    def _make_room(self) -> None:
        """Forget closed connections; if still at the cap, close the oldest idle ones."""
        self._forget_closed()
        if len(self.open) < self.cap:
            return
        want = max(1, int(self.cap * EVICT_FRACTION))
        victims = []
        for handler in self.open:
            if handler not in self.busy:
                victims.append(handler)
                if len(victims) >= want:
                    break
        for handler in victims:
            self.evicted += 1
            self._close(handler)

    def _forget_closed(self) -> None:
        for handler in [h for h in self.open if self._closed(h)]:
            self._drop(handler)

    def _closed(self, handler: Any) -> bool:
        if getattr(handler, "transport", None) is not None:
            self.made.add(handler)
            return False
        return handler in self.made

    def _close(self, handler: Any) -> None:
        with contextlib.suppress(Exception):
            handler.force_close()
        self._drop(handler)

    def _drop(self, handler: Any) -> None:
        self.open.pop(handler, None)
        self.started.pop(handler, None)
        self.made.discard(handler)


class QuietAcceptErrors:
    """An event-loop exception handler that reports running out of file descriptors once a minute, as
    one line, instead of a traceback per refused accept (asyncio retries the accept by itself)."""

    RESOURCE_MESSAGE = "socket.accept() out of system resource"

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float = 60.0) -> None:
        self.loop = loop
        self.every = every
        self.last = 0.0
        self.suppressed = 0
        self.previous = loop.get_exception_handler()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        exc = context.get("exception")
        if message.startswith(self.RESOURCE_MESSAGE) or (isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS):
            now = time.monotonic()
            if now - self.last >= self.every:
                extra = f" ({self.suppressed} more since the last report)" if self.suppressed else ""
                print(f"adaflash serve: out of file descriptors, new connections wait: {exc}{extra}",
                      file=sys.stderr, flush=True)
                self.last, self.suppressed = now, 0
            else:
                self.suppressed += 1
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


def _resource_errnos() -> frozenset[int]:
    import errno

    return frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


_RESOURCE_ERRNOS = _resource_errnos()
