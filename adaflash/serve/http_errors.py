"""The server's error responses: every 4xx/5xx is a JSON body naming what was wrong, aiohttp's own included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from adaflash.serve.protocol import BadRequest

MAX_BODY_BYTES = 64 * 1024 * 1024


KINDS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 408: "RequestTimeout",
         413: "RequestTooLarge", 503: "ServiceUnavailable"}


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


async def json_body(request: web.Request, timeout: float | None = None) -> Any:
    """The request's JSON body, read within `timeout` seconds (a 408 after it)."""
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise BadRequest(f"the request body did not arrive within {timeout:g} s", 408) from None
    return parse_json(raw)
