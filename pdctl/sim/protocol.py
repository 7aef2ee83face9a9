"""Request fields and error bodies of SGLang's HTTP API (the sim's `protocol.py`).

Error shapes follow sglang 0.5.23 (`entrypoints/http_server.py`, `openai/serving_base.py`):
- /generate: `{"error": {"message": ...}}` (400), or for a 500 abort the ErrorResponse
  `{"object": "error", "message", "type": "500", "param": null, "code"}`.
- OpenAI routes: `{"object": "error", "message", "type": "BadRequestError", "param": null,
  "code": 400}`.
- Malformed JSON: FastAPI's validation error, turned into 400 with type "Bad Request".
- Unknown body fields are ignored (SGLang's request models allow extras).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web


class BadRequest(Exception):
    """SGLang's ValueError path: HTTP 400."""


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def json_response(body: Any, status: int = 200, dump: Callable[[Any], str] = dumps) -> web.Response:
    return web.json_response(body, status=status, dumps=dump)


def openai_error(
    message: str, status: int = 400, err_type: str = "BadRequestError"
) -> web.Response:
    body = {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return json_response(body, status)


def json_decode_error(e: json.JSONDecodeError) -> web.Response:
    """FastAPI's RequestValidationError for a body that is not JSON, as SGLang reshapes it."""
    errors = [
        {
            "type": "json_invalid",
            "loc": ("body", e.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": e.msg},
        }
    ]
    return openai_error(f"{errors}", 400, HTTPStatus.BAD_REQUEST.phrase)


def validation_error(kind: str, loc: tuple[str, ...], msg: str, value: Any) -> web.Response:
    """A pydantic validation failure as SGLang reshapes FastAPI's RequestValidationError."""
    errors = [{"type": kind, "loc": loc, "msg": msg, "input": value}]
    return openai_error(f"{errors}", 400, HTTPStatus.BAD_REQUEST.phrase)


def as_int(value: Any) -> int | None:
    """An integer request field, None when it is not one (strings of digits pass, as in
    pydantic's lax mode)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


@dataclass
class Parsed:
    prompt_tokens: int
    max_new_tokens: int | None
    stream: bool
    rid: str
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    include_usage: bool
    model: str
    ignore_eos: bool = False


def first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def pd_fields(body: dict[str, Any]) -> tuple[str | None, int | None, int | None]:
    port = first(body.get("bootstrap_port"))
    room = first(body.get("bootstrap_room"))
    return (
        first(body.get("bootstrap_host")),
        (int(port) if port is not None else None),
        (int(room) if room is not None else None),
    )
