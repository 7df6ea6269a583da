"""One server-sent-events response, shared by the native and the OpenAI streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class EventStream:
    """`data:` events written one at a time (several requests' pumps share one response); a write that
    fails means the client left, and `gone` tells the handler to abort what is still decoding."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.lock = asyncio.Lock()
        self.gone = False

    @classmethod
    async def open(cls, request: web.Request) -> EventStream:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        return cls(response)

    async def send(self, payload: dict[str, Any] | str) -> None:
        if self.gone:
            return
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        try:
            async with self.lock:
                await self.response.write(f"data: {data}\n\n".encode())
        except (ConnectionResetError, RuntimeError):
            self.gone = True

    async def close(self) -> web.StreamResponse:
        """`data: [DONE]`, then the end of the response (unless the client already left)."""
        await self.send("[DONE]")
        if not self.gone:
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await self.response.write_eof()
        return self.response
