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
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .sampling import SamplingParams


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


def validation_error(
    kind: str, loc: tuple[str, ...], msg: str, value: Any, **ctx: str
) -> web.Response:
    """A pydantic validation failure as SGLang reshapes FastAPI's RequestValidationError."""
    error: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        error["ctx"] = ctx
    errors = [error]
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
    prompt_key: str  # the prompt as sent: what a request `seed` keys the output on
    max_new_tokens: int | None
    stream: bool
    rid: str
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    include_usage: bool
    model: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rooms: tuple[int, ...] = ()  # one room per sample, when the gateway sent a list


class FieldError(Exception):
    """A request field of the wrong type, in pydantic's words (OpenAI routes) and serde's
    (the /generate contract check)."""

    def __init__(self, field: str, value: Any, kind: str, msg: str, expected: str) -> None:
        super().__init__(field)
        self.field, self.value, self.kind, self.msg, self.expected = (
            field,
            value,
            kind,
            msg,
            expected,
        )

    def serde(self) -> str:
        v = self.value
        kind = f'string "{v}"' if isinstance(v, str) else type(v).__name__
        return f"invalid type: {kind}, expected {self.expected}"


def int_field(src: dict[str, Any], field: str, default: int | None) -> int | None:
    value = src.get(field)
    if value is None:
        return default
    parsed = as_int(value)
    if parsed is None:
        raise FieldError(
            field,
            value,
            "int_parsing",
            "Input should be a valid integer, unable to parse string as an integer",
            "i64",
        )
    return parsed


def sampling_params(
    src: dict[str, Any], seed_field: str, logprobs: bool, top_logprobs: int
) -> SamplingParams:
    """n, stop, stop_token_ids, ignore_eos and the seed from a body (OpenAI) or its
    `sampling_params` (/generate)."""
    stop = src.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise FieldError("stop", stop, "string_type", "Input should be a valid string", "string")
    ids = src.get("stop_token_ids") or []
    if not isinstance(ids, list) or any(as_int(i) is None for i in ids):
        raise FieldError(
            "stop_token_ids", ids, "list_type", "Input should be a valid list", "a sequence"
        )
    return SamplingParams(
        n=int_field(src, "n", 1) or 0,
        stop=stops,
        stop_token_ids=frozenset(int(i) for i in ids),
        ignore_eos=bool(src.get("ignore_eos") or False),
        seed=int_field(src, seed_field, None),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def rooms(body: dict[str, Any]) -> tuple[int, ...]:
    room = body.get("bootstrap_room")
    return tuple(int(r) for r in room) if isinstance(room, list) else ()


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
