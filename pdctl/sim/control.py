"""Readiness and generation control (SGLang 0.5.23's `entrypoints/http_server.py`: `ready`,
`sagemaker_health` (/ping), `pause_generation`, `continue_generation`; the state they read
and set lives in `tokenizer_manager.py` and `scheduler.py`).

- `GET /ready`: 200 only when `TokenizerManager.is_ready()`: started, not shutting down,
  not unhealthy (a failed /health) and not paused; else 503. Empty bodies.
- `GET /ping`: 200 when `is_healthy()`: as /ready but a paused server still answers 200.
- `POST /pause_generation` (`PauseGenerationReqInput`: `mode` abort | retract | in_place,
  default abort) and `POST /continue_generation` (`ContinueGenerationReqInput`:
  `torch_empty_cache`, a no-op without a GPU) answer `{"message": "Generation paused
  successfully.", "status": "ok"}` / `"Generation continued successfully."`. Each needs a
  JSON object body (`{}` will do): FastAPI's validation errors otherwise, as SGLang
  reshapes them (400). Extra fields are ignored.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .protocol import json_decode_error, json_response, validation_error

if TYPE_CHECKING:
    from .server import SimServer

PAUSE_MODES = ("abort", "retract", "in_place")  # PauseGenerationReqInput.mode's Literal
# pydantic's lax bool: what ContinueGenerationReqInput.torch_empty_cache accepts from JSON.
TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})
FALSE_WORDS = frozenset({"0", "off", "f", "false", "n", "no"})


async def _object(request: web.Request) -> dict[str, Any] | web.Response:
    """The body as a msgspec request struct's pydantic schema takes it: required (an empty
    body is missing), a JSON object, unknown fields ignored."""
    raw = await request.read()
    if not raw:
        return validation_error("missing", ("body",), "Field required", None)
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        return json_decode_error(e)
    if not isinstance(body, dict):
        return validation_error("dict_type", ("body",), "Input should be a valid dictionary", body)
    for name in ("rid", "http_worker_ipc"):  # BaseReq's Optional[str] fields
        if body.get(name) is not None and not isinstance(body[name], str):
            return validation_error(
                "string_type", ("body", name), "Input should be a valid string", body[name]
            )
    return body


def _mode(body: dict[str, Any]) -> str | web.Response:
    mode = body.get("mode", "abort")
    if mode in PAUSE_MODES and isinstance(mode, str):
        return str(mode)
    expected = "'abort', 'retract' or 'in_place'"
    return validation_error(
        "literal_error", ("body", "mode"), f"Input should be {expected}", mode, expected=expected
    )


def _bool_error(body: dict[str, Any], name: str) -> web.Response | None:
    v = body.get(name, True)
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return None
    if isinstance(v, str):
        if v.strip().lower() in TRUE_WORDS | FALSE_WORDS:
            return None
        msg = "Input should be a valid boolean, unable to interpret input"
        return validation_error("bool_parsing", ("body", name), msg, v)
    return validation_error("bool_type", ("body", name), "Input should be a valid boolean", v)


class ControlRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    async def ready(self, _: web.Request) -> web.Response:
        """http_server.ready: tokenizer_manager.is_ready() = not is_pause and is_healthy()."""
        ok = self.server.status == "up" and not self.server.tm.is_pause
        return web.Response(status=200 if ok else 503)

    async def ping(self, _: web.Request) -> web.Response:
        """http_server.sagemaker_health: is_healthy(), a flag check (a paused server is 200)."""
        return web.Response(status=200 if self.server.status == "up" else 503)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await _object(request)
        if isinstance(body, web.Response):
            return body
        mode = _mode(body)
        if isinstance(mode, web.Response):
            return mode
        await self.server.tm.pause_generation(mode)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await _object(request)
        if isinstance(body, web.Response):
            return body
        if (error := _bool_error(body, "torch_empty_cache")) is not None:
            return error
        await self.server.tm.continue_generation()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})
