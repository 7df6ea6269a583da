"""The server's error responses: every 4xx/5xx is a JSON body naming what was wrong, aiohttp's own included."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from adaflash.serve.protocol import BadRequest

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_LOGGED_CHARS = 200  # of a client's bytes quoted in a log line or an error message

log = logging.getLogger("adaflash.serve")


KINDS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 408: "RequestTimeout",
         413: "RequestTooLarge", 415: "UnsupportedMediaType", 503: "ServiceUnavailable"}


def error_body(message: str, kind: str = "BadRequest", *, param: str | None = None,
               code: int | str | None = None) -> dict[str, Any]:
    """OpenAI's error object (message, type, param, code); `code` is the HTTP status, as SGLang and vLLM send."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(message: str, status: int = 400, *, param: str | None = None) -> web.Response:
    kind = KINDS.get(status, "InternalServerError")
    return web.json_response(error_body(message, kind, param=param, code=status), status=status)


def http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own 4xx/5xx as our JSON error, saying what was wrong (and keeping a 405's Allow header)."""
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        response = error_response(f"{request.method} is not allowed on {request.path}; use {allowed}", 405)
        response.headers["Allow"] = allowed
        return response
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(f"the request body is over the server's limit of {MAX_BODY_BYTES} bytes ({exc.text})", 413)
    if isinstance(exc, web.HTTPNotFound):
        return error_response(f"no endpoint {request.path}", 404)
    return error_response(exc.reason or exc.text or "error", exc.status)


MAX_INT_DIGITS = 64  # longer integer literals stay text (`HugeInt`): no field takes one, and int() is slow


class HugeInt:
    """An integer literal too long to be any field's value: kept as its digits (neither a number nor a
    string to any check), so the field check that meets it names the field. A bare int() would fail,
    or take quadratic time, inside the JSON parser, with no field to name."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {len(self.digits.lstrip('-'))} digits"


def _parse_int(text: str) -> int | HugeInt:
    return int(text) if len(text) <= MAX_INT_DIGITS else HugeInt(text)


def parse_json(raw: bytes) -> Any:
    """The decoded body; BadRequest (400) for text that is not JSON, or JSON nested too deep to decode."""
    try:
        return json.loads(raw, parse_int=_parse_int) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request body is not valid JSON ({err})") from None
    except RecursionError:
        raise BadRequest("the request body nests JSON arrays or objects too deeply to decode") from None
    except ValueError as err:  # any other literal the decoder refuses
        raise BadRequest(f"the request body is not valid JSON ({err})") from None


def one_line(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text` as one printable ASCII line of at most `limit` characters (so a client cannot forge log lines)."""
    flat = " ".join(text.split()).encode("ascii", "backslashreplace").decode("ascii")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def declared_too_large(request: web.Request) -> web.Response | None:
    """A 413 for a request whose Content-Length is over the body limit, answered from its head before a
    byte of the body is read (aiohttp would read up to the limit first); None for any other request."""
    declared = request.content_length
    if declared is None or declared <= MAX_BODY_BYTES:
        return None
    response = error_response(f"the request body ({declared} bytes, as its Content-Length says) is over the "
                              f"server's limit of {MAX_BODY_BYTES} bytes", 413)
    response.force_close()  # the client may still be sending it
    return response


def _payload_problem(err: web.RequestPayloadError) -> str:
    """What was wrong with a body the parser could not read: its cause's message (a content encoding
    that does not decode, a broken chunked encoding, a body shorter than its Content-Length)."""
    cause = err.__cause__
    text = cause.message if isinstance(cause, HttpProcessingError) else str(err)
    return one_line(str(text))


async def json_body(request: web.Request, timeout: float | None = None) -> Any:
    """The request's JSON body, read within `timeout` seconds (a 408 after it); a body that cannot be
    decoded (bad gzip, deflate or chunked encoding) is a 400 and one log line."""
    try:
        # A body already whole (a small request's comes with its headers) is read without wait_for's task
        # and timer: on Python 3.11 they cost the handler turns of an event loop that streams 64 answers.
        raw = await (request.read() if request.content.is_eof() else asyncio.wait_for(request.read(), timeout))
    except asyncio.TimeoutError:
        raise BadRequest(f"the request body did not arrive within {timeout:g} s", 408) from None
    except web.RequestPayloadError as err:
        problem = _payload_problem(err)
        log.warning("adaflash serve: refused an unreadable request body from %s: %s", request.remote, problem)
        raise BadRequest(f"the request body could not be read: {problem}") from None
    return parse_json(raw)
