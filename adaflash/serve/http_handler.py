"""The connection handler: aiohttp's, with what its HTTP parser refuses answered as our JSON errors.

Why: a request the parser cannot read (method `FOO`, a 100 KB URL, a duplicate or negative
Content-Length, NUL bytes in a header, HTTP/2's preface, TLS bytes, a body that does not decode) never
reaches the application's middlewares. aiohttp answers it itself, in text/plain, and logs a full
traceback for each; a port open to the internet sees such bytes all day. `JsonRequestHandler` answers
them in the error shape every other error has, and logs one line each, never a traceback (a traceback
stays the mark of a bug: a 5xx). It also tells the connection guard the moment its connection is gone,
so `open_connections` is current.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from adaflash.serve.http_errors import error_response, one_line

log = logging.getLogger("adaflash.serve")


def parser_error(exc: BaseException | None, message: str | None, status: int = 400) -> tuple[int, str]:
    """The status and the words a client can act on for a request the HTTP parser refused."""
    if isinstance(exc, ContentEncodingError):  # raised from the head: a coding this server cannot decode
        return 415, "the request's Content-Encoding is not supported: send the body as is, or gzip or deflate it"
    return status, one_line(parser_error_message(exc, message))


def parser_error_message(exc: BaseException | None, message: str | None) -> str:
    """What was wrong with a request the HTTP parser refused."""
    if isinstance(exc, LineTooLong):
        return f"the request line or a header is longer than the server's limit of {exc.args[1]} bytes"
    text = exc.message if isinstance(exc, HttpProcessingError) else message or (str(exc) if exc else "")
    first = (text or "malformed HTTP request").strip().splitlines()[0].rstrip(":. ")
    if first.startswith("Pause on PRI"):
        return "HTTP/2 with prior knowledge is not supported: this server speaks HTTP/1.1"
    if "HTTPS traffic" in first:
        return "TLS bytes on a plain-HTTP port: this server speaks http://, not https://"
    if isinstance(exc, BadHttpMethod):
        return f"not an HTTP/1.x request: {first}"
    return f"malformed HTTP request: {first}"


class JsonRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, with JSON parser errors, one-line logs and a close callback."""

    on_lost: Callable[[Any], None] | None = None  # set by the connection guard

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """The answer to a request the parser refused (or, rarely, one whose handler raised past the
        middlewares): our JSON error, and the connection closed after it, as aiohttp does."""
        if request.writer.output_size > 0:  # part of a response went out: only closing is left
            raise ConnectionError("a response was already partly sent; closing the connection")
        if isinstance(exc, ConnectionError):  # the client left mid-request: nobody to answer or blame
            log.debug("client %s left during its request: %s", request.remote, exc)
            text = "the client closed the connection"
        elif status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
            text = f"internal error: {type(exc).__name__}" if exc else "internal error"
        else:
            status, text = parser_error(exc, message, status)
            log.warning("adaflash serve: refused a malformed request from %s: %s", request.remote, text)
        response = error_response(text, status)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's other error reports (a body that failed to decode while it was being drained after
        the answer, say), as one line: the request was answered already."""
        exc = kw.get("exc_info")
        what = one_line(_formatted(args) or "connection error")
        detail = f": {type(exc).__name__}: {one_line(str(exc))}" if isinstance(exc, BaseException) else ""
        if isinstance(exc, (web.RequestPayloadError, ConnectionError)):
            log.debug("%s%s", what, detail)
        else:
            log.warning("adaflash serve: %s%s", what, detail)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost(self)


def _formatted(args: tuple[Any, ...]) -> str:
    """A logging call's message with its arguments filled in."""
    if not args:
        return ""
    try:
        return str(args[0]) % args[1:] if len(args) > 1 else str(args[0])
    except (TypeError, ValueError):
        return " ".join(map(str, args))


def handler_factory(server: web.Server, **kwargs: Any) -> Callable[[], JsonRequestHandler]:
    """A protocol factory like `server` itself (aiohttp's), making `JsonRequestHandler`s with `kwargs`
    (the keyword arguments `web.AppRunner` would pass on to aiohttp's handlers). Call it on the loop
    that serves."""
    loop = asyncio.get_running_loop()

    def make() -> JsonRequestHandler:
        return JsonRequestHandler(server, loop=loop, **kwargs)

    return make
