"""The server's error responses: every 4xx/5xx is a JSON body naming what was wrong, aiohttp's own included."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from adaflash.serve.protocol import BadRequest

MAX_BODY_BYTES = 64 * 1024 * 1024


def error_body(message: str, kind: str = "BadRequest") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def error_response(message: str, status: int = 400) -> web.Response:
    kind = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed",
            413: "RequestTooLarge", 503: "ServiceUnavailable"}.get(status, "InternalServerError")
    return web.json_response(error_body(message, kind), status=status)


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


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request body is not valid JSON ({err})") from None
