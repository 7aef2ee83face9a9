"""What the OpenAI routes share (SGLang's `openai/serving_base.py`): body checks, the
request fields, running the request's n samples and answering whole or as a stream.

Shapes follow sglang 0.5.23 `openai/protocol.py`: a whole answer carries `metadata`
{"weight_version"} and the usage of all samples (prompt tokens once per prompt, completion
tokens summed, UsageProcessor); `matched_stop` is the stop string or token id that ended a
choice (the eos id when it ended on its own). A stream waits for its first event before
answering 200 (so validation errors stay HTTP 400, as serving_chat's kick-start does) and
carries later aborts as `{"error": ErrorResponse}` whose type is the status name.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from .protocol import (
    BadRequest,
    FieldError,
    Parsed,
    as_int,
    json_decode_error,
    json_response,
    openai_error,
    pd_fields,
    rooms,
    sampling_params,
    validation_error,
)
from .req import Abort, Event, Finish, Req, Token
from .sampling import Sample
from .streaming import DONE, sse_data, sse_response
from .tokenizer_manager import Outcome, TokenizerManager

Events = AsyncGenerator[tuple[int, Event], None]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


class OpenAIServing:
    object = ""  # the answer's "object"
    chunk_object = ""  # a stream chunk's "object"
    prefix = ""  # of the answer's id
    usage_drops_null = False  # the usage chunk leaves out null fields

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
        self,
        body: dict[str, Any],
        prompt_tokens: int,
        prompt_key: str,
        field: str,
        max_tokens: Any,
        logprobs: bool,
        top_logprobs: Any,
    ) -> Parsed | web.Response:
        """The request's fields; `top_logprobs` is the field that sets the top count."""
        if max_tokens is not None and as_int(max_tokens) is None:
            return validation_error(
                "int_parsing",
                ("body", field),
                "Input should be a valid integer, unable to parse string as an integer",
                max_tokens,
            )
        try:
            top = 0 if top_logprobs is None else as_int(top_logprobs)
            if top is None:
                raise FieldError(
                    "top_logprobs",
                    top_logprobs,
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                    "i64",
                )
            sampling = sampling_params(body, "seed", logprobs, top)
        except FieldError as e:
            return validation_error(e.kind, ("body", e.field), e.msg, e.value)
        host, port, room = pd_fields(body)
        opts = body.get("stream_options") or {}
        return Parsed(
            prompt_tokens=prompt_tokens,
            prompt_key=prompt_key,
            max_new_tokens=as_int(max_tokens),
            stream=bool(body.get("stream", False)),
            rid=str(body.get("rid") or self.tm.new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=bool(opts.get("include_usage", False)),
            model=str(body.get("model") or self.tm.cfg.served_model_name),
            sampling=sampling,
            rooms=rooms(body),
        )

    def rid(self, req: Req) -> str:
        return req.rid if req.rid.startswith(self.prefix) else f"{self.prefix}-{req.rid}"

    async def run(self, request: web.Request, p: Parsed) -> web.StreamResponse:
        try:
            reqs = await self.tm.start(p)
        except BadRequest as e:
            return openai_error(str(e))
        created = int(time.time())
        if not p.stream:
            outcomes = await self.tm.collect(reqs)
            if isinstance(outcomes, Abort):
                return abort_error(outcomes)
            return json_response(
                {
                    "id": self.rid(reqs[0]),
                    "object": self.object,
                    "created": created,
                    "model": p.model,
                    "choices": [self.choice(i, o) for i, o in enumerate(outcomes)],
                    "usage": usage(p.prompt_tokens, sum(o.req.generated for o in outcomes)),
                    "metadata": {"weight_version": "default"},
                }
            )
        async with contextlib.aclosing(self.tm.stream(reqs)) as events:
            # Wait for the first event before answering 200, as serving_chat does.
            first = await anext(events)
            resp = await sse_response(request)
            head = {"created": created, "model": p.model}
            await self.stream(resp, p, Outputs(reqs, chain(first, events)), head)
        await resp.write(DONE)
        return resp

    def choice(self, index: int, outcome: Outcome) -> dict[str, Any]:
        raise NotImplementedError

    async def stream(
        self, resp: web.StreamResponse, p: Parsed, out: Outputs, head: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    async def write_usage(
        self, resp: web.StreamResponse, p: Parsed, out: Outputs, head: dict[str, Any]
    ) -> None:
        """The closing usage chunk, when `stream_options.include_usage` asks for it."""
        if not p.include_usage:
            return
        body = usage(p.prompt_tokens, sum(r.generated for r in out.reqs))
        if self.usage_drops_null:
            body = {k: v for k, v in body.items() if v is not None}
        head = {"id": self.rid(out.reqs[out.last]), "object": self.chunk_object, **head}
        await resp.write(sse_data({**head, "choices": [], "usage": body}))


async def chain(first: tuple[int, Event], rest: Events) -> Events:
    yield first
    async for item in rest:
        yield item


def abort_error(ev: Abort) -> web.Response:
    if ev.status == 400:
        return openai_error(ev.message)
    return openai_error(ev.message, int(ev.status), str(int(ev.status)))


def stream_error(ev: Abort) -> bytes:
    """create_streaming_error_response."""
    err = {
        "object": "error",
        "message": ev.message,
        "type": ev.status.name,
        "param": None,
        "code": int(ev.status),
    }
    return sse_data({"error": err})


def choice(
    index: int, content: dict[str, Any], logprobs: dict[str, Any] | None, fin: Finish | None
) -> dict[str, Any]:
    """A choice, whole or a stream chunk's: its content fields between index and logprobs, and
    `finish_reason` / `matched_stop` (null until it finishes)."""
    return {
        "index": index,
        **content,
        "logprobs": logprobs,
        "finish_reason": fin.reason if fin else None,
        "matched_stop": fin.matched if fin else None,
    }


class Outputs:
    """A stream's outputs per sample: a token right before its finish goes out with it, as
    SGLang's last output carries both. `last` is the sample of the latest event, whose id the
    closing chunks carry."""

    def __init__(self, reqs: list[Req], events: Events) -> None:
        self.reqs = reqs
        self.events = events
        self.last = 0
        self.text = ["" for _ in reqs]
        self.samples: list[list[Sample]] = [[] for _ in reqs]

    async def each(
        self, resp: web.StreamResponse
    ) -> AsyncGenerator[tuple[int, str, list[Sample], Finish | None], None]:
        """(sample, text, samples, finish or None) per output; an abort is written as the
        stream's error and ends the outputs."""
        async for i, ev in self.events:
            self.last = i
            if isinstance(ev, Abort):
                await resp.write(stream_error(ev))
                return
            if isinstance(ev, Token):
                self.text[i] += ev.text
                if ev.sample is not None:
                    self.samples[i].append(ev.sample)
                if not self.reqs[i].out.empty():
                    continue  # its finish is right behind: one output, as in SGLang
                fin = None
            else:
                self.text[i] += ev.tail
                fin = ev
            text, samples = self.text[i], self.samples[i]
            self.text[i], self.samples[i] = "", []
            yield i, text, samples, fin
