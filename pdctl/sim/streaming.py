"""Server-sent events as SGLang streams them: `data: <json>\n\n` frames, `data: [DONE]`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .protocol import dumps

DONE = b"data: [DONE]\n\n"


def sse_data(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


async def sse_response(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp
