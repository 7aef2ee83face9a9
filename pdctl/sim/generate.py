"""SGLang's native `/generate` route (`http_server.generate_request`).

A stream carries the cumulative text in each chunk, aborts in `meta_info.finish_reason`,
then `data: [DONE]`; an abort of a non-stream request answers 400 `{"error": ...}` or the
500 ErrorResponse."""

from __future__ import annotations

import json
from http import HTTPStatus

from aiohttp import web

from .engine import Abort, Event, Req, Token
from .model import count_tokens
from .protocol import (
    BadRequest,
    Parsed,
    as_int,
    first,
    json_decode_error,
    json_response,
    openai_error,
    pd_fields,
)
from .streaming import DONE, sse_data, sse_response
from .tokenizer_manager import TokenizerManager


class NativeGenerate:
    def __init__(self, tm: TokenizerManager) -> None:
        self.tm = tm

    async def handle(self, request: web.Request) -> web.StreamResponse:
        tm = self.tm
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as e:
            return json_decode_error(e)
        if not isinstance(body, dict):
            kind = "sequence" if isinstance(body, list) else type(body).__name__
            return json_response(
                {"error": f"invalid type: {kind}, expected struct GenerateRequest"}, status=400
            )
        sp = body.get("sampling_params") or {}
        text = first(body.get("text"))
        ids = body.get("input_ids")
        if text is None and ids is None:
            return json_response(
                {
                    "error": {
                        "message": "Either text, input_ids or input_embeds should be provided."
                    }
                },
                status=400,
            )
        max_new = sp.get("max_new_tokens", 128)
        if as_int(max_new) is None or isinstance(max_new, str):
            # The JSON contract check (api/v1 GenerateRequest) answers in serde's words.
            kind = f'string "{max_new}"' if isinstance(max_new, str) else type(max_new).__name__
            return json_response({"error": f"invalid type: {kind}, expected i64"}, status=400)
        if text is not None:
            prompt_tokens = count_tokens(str(text))
        else:
            one = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) else ids
            prompt_tokens = len(one) if isinstance(one, list) else 1
        host, port, room = pd_fields(body)
        p = Parsed(
            prompt_tokens=prompt_tokens,
            max_new_tokens=int(max_new),
            stream=bool(body.get("stream", False)),
            rid=str(first(body.get("rid")) or tm.new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=False,
            model=tm.cfg.served_model_name,
            ignore_eos=bool(sp.get("ignore_eos", False)),
        )
        try:
            req = await tm.start(p)
        except BadRequest as e:
            return json_response({"error": {"message": str(e)}}, status=400)
        if not p.stream:
            text_out = ""
            async for ev in tm.events(req):
                if isinstance(ev, Token):
                    text_out += ev.text
                elif isinstance(ev, Abort):
                    return self._abort(ev)
                else:
                    return json_response({"text": text_out, "meta_info": tm.meta(req, ev)})
        resp = await sse_response(request)
        text_out = ""
        async for ev in tm.events(req):
            if isinstance(ev, Token):
                text_out += ev.text
                # The finish event right behind the last token goes out in the same chunk.
                if not req.out.empty():
                    continue
                await resp.write(self._chunk(text_out, req, None))
            else:
                await resp.write(self._chunk(text_out, req, ev))
        await resp.write(DONE)
        return resp

    def _chunk(self, text: str, req: Req, finish: Event | None) -> bytes:
        return sse_data({"text": text, "meta_info": self.tm.meta(req, finish), "index": 0})

    @staticmethod
    def _abort(ev: Abort) -> web.Response:
        if ev.status == HTTPStatus.BAD_REQUEST:
            return json_response({"error": {"message": ev.message}}, status=400)
        return openai_error(ev.message, int(ev.status), str(int(ev.status)))
