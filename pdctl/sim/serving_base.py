"""What the OpenAI routes share (SGLang's `openai/serving_base.py`): body checks, the
request fields, running a request and answering it whole or as a stream.

A stream waits for its first event before answering 200 (so validation errors stay HTTP
400, as serving_chat's kick-start does) and carries later aborts as an error chunk whose
type is the status name."""

from __future__ import annotations

import json
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .engine import Abort, Event, Finish, Req, Token
from .protocol import (
    BadRequest,
    Parsed,
    as_int,
    json_decode_error,
    json_response,
    openai_error,
    pd_fields,
    validation_error,
)
from .streaming import DONE, sse_data, sse_response
from .tokenizer_manager import TokenizerManager


class OpenAIServing:
    def __init__(self, tm: TokenizerManager) -> None:
        self.tm = tm

    async def body(self, request: web.Request, required: str) -> dict[str, Any] | web.Response:
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as e:
            return json_decode_error(e)
        if not isinstance(body, dict):
            return validation_error(
                "model_attributes_type",
                ("body",),
                "Input should be a valid dictionary or object to extract fields from",
                body,
            )
        if required not in body:
            return validation_error("missing", ("body", required), "Field required", body)
        return body

    def parsed(
        self, body: dict[str, Any], prompt_tokens: int, field: str, max_tokens: Any
    ) -> Parsed | web.Response:
        if max_tokens is not None and as_int(max_tokens) is None:
            return validation_error(
                "int_parsing",
                ("body", field),
                "Input should be a valid integer, unable to parse string as an integer",
                max_tokens,
            )
        host, port, room = pd_fields(body)
        opts = body.get("stream_options") or {}
        return Parsed(
            prompt_tokens=prompt_tokens,
            max_new_tokens=as_int(max_tokens),
            stream=bool(body.get("stream", False)),
            rid=str(body.get("rid") or self.tm.new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=bool(opts.get("include_usage", False)),
            model=str(body.get("model") or self.tm.cfg.served_model_name),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )

    async def run(
        self, request: web.Request, p: Parsed, obj: str, prefix: str
    ) -> web.StreamResponse:
        try:
            req = await self.tm.start(p)
        except BadRequest as e:
            return openai_error(str(e))
        chat = obj == "chat.completion"
        rid = f"{prefix}-{req.rid}" if not req.rid.startswith(prefix) else req.rid
        created = int(time.time())
        events = self.tm.events(req)
        if not p.stream:
            text = ""
            async for out in events:
                if isinstance(out, Token):
                    text += out.text
                elif isinstance(out, Abort):
                    if out.status == HTTPStatus.BAD_REQUEST:
                        return openai_error(out.message)
                    return openai_error(out.message, int(out.status), str(int(out.status)))
                else:
                    choice: dict[str, Any] = {
                        "index": 0,
                        "logprobs": None,
                        "finish_reason": out.reason,
                        "matched_stop": None,
                    }
                    if chat:
                        choice["message"] = {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": None,
                            "tool_calls": None,
                        }
                    else:
                        choice["text"] = text
                    return json_response(
                        {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": p.model,
                            "choices": [choice],
                            "usage": self.usage(req),
                        }
                    )
        # Wait for the first event before answering 200, as serving_chat does.
        first = await anext(events)
        resp = await sse_response(request)
        chunk_obj = f"{obj}.chunk" if chat else obj
        role_sent = False

        async def send(delta_text: str | None, finish: str | None) -> None:
            nonlocal role_sent
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            if chat:
                delta: dict[str, Any] = {}
                if not role_sent:
                    delta["role"] = "assistant"
                    role_sent = True
                if delta_text is not None:
                    delta["content"] = delta_text
                choice["delta"] = delta
            else:
                choice["text"] = delta_text or ""
            chunk = {
                "id": rid,
                "object": chunk_obj,
                "created": created,
                "model": p.model,
                "choices": [choice],
                "usage": None,
            }
            await resp.write(sse_data(chunk))

        ev: Event | None = first
        while ev is not None:
            if isinstance(ev, Abort):
                err = {
                    "object": "error",
                    "message": ev.message,
                    "type": ev.status.name,
                    "param": None,
                    "code": int(ev.status),
                }
                await resp.write(sse_data(err))
                break
            if isinstance(ev, Token):
                if chat and not role_sent:
                    await send("", None)
                await send(ev.text, None)
            else:
                assert isinstance(ev, Finish)
                await send(None if chat else "", ev.reason)
                if p.include_usage:
                    chunk = {
                        "id": rid,
                        "object": chunk_obj,
                        "created": created,
                        "model": p.model,
                        "choices": [],
                        "usage": self.usage(req),
                    }
                    await resp.write(sse_data(chunk))
                break
            ev = await anext(events, None)
        await events.aclose()
        await resp.write(DONE)
        return resp

    @staticmethod
    def usage(req: Req) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }
