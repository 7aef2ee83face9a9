"""SGLang's native `/generate` route (`http_server.generate_request`).

A stream carries the cumulative text and output ids in each chunk, aborts in
`meta_info.finish_reason`, then `data: [DONE]`; an abort of a non-stream request answers
400 `{"error": ...}` or the 500 ErrorResponse. `sampling_params.n` > 1 answers a list of
outputs (a stream tags each chunk with its sample's `index`); `sampling_params` also take
stop, stop_token_ids, ignore_eos and sampling_seed, the body return_logprob,
top_logprobs_num and return_text_in_logprobs."""

from __future__ import annotations

import contextlib
import json
from http import HTTPStatus

from aiohttp import web

from .model import count_tokens
from .protocol import (
    BadRequest,
    FieldError,
    Parsed,
    as_int,
    first,
    int_field,
    json_decode_error,
    json_response,
    openai_error,
    pd_fields,
    rooms,
    sampling_params,
)
from .req import Abort, Finish, Req, Token
from .sampling import Sample
from .streaming import DONE, sse_data, sse_response
from .tokenizer_manager import TokenizerManager


class NativeGenerate:
    def __init__(self, tm: TokenizerManager) -> None:
        self.tm = tm

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as e:
            return json_decode_error(e)
        p = self._parse(body)
        if isinstance(p, web.Response):
            return p
        with_text = bool(body.get("return_text_in_logprobs"))
        try:
            reqs = await self.tm.start(p)
        except BadRequest as e:
            return json_response({"error": {"message": str(e)}}, status=400)
        if not p.stream:
            return await self._answer(reqs, with_text)
        return await self._stream(request, reqs, with_text)

    def _parse(self, body: object) -> Parsed | web.Response:
        """The request as the engine takes it, or the 400 that refuses it (in the words of
        SGLang's JSON contract check where it has them)."""
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
        try:
            sampling = sampling_params(
                sp,
                "sampling_seed",
                logprobs=bool(body.get("return_logprob")),
                top_logprobs=int_field(body, "top_logprobs_num", 0) or 0,
            )
        except FieldError as e:
            return json_response({"error": e.serde()}, status=400)
        host, port, room = pd_fields(body)
        return Parsed(
            prompt_tokens=prompt_tokens,
            prompt_key=str(text if text is not None else ids),
            max_new_tokens=int(max_new),
            stream=bool(body.get("stream", False)),
            rid=str(first(body.get("rid")) or self.tm.new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=False,
            model=self.tm.cfg.served_model_name,
            sampling=sampling,
            rooms=rooms(body),
        )

    async def _answer(self, reqs: list[Req], with_text: bool) -> web.Response:
        """A non-stream request: one output, or a list of them for n > 1."""
        tm = self.tm
        outcomes = await tm.collect(reqs)
        if isinstance(outcomes, Abort):
            return self._abort(outcomes)
        outs = [
            self._output(o.text, o.samples, tm.meta(o.req, o.finish, o.samples, with_text))
            for o in outcomes
        ]
        return json_response(outs[0] if len(outs) == 1 else outs)

    async def _stream(
        self, request: web.Request, reqs: list[Req], with_text: bool
    ) -> web.StreamResponse:
        """A stream: each chunk the sample's cumulative text and ids, tagged with its index."""
        tm = self.tm
        resp = await sse_response(request)
        texts = ["" for _ in reqs]
        samples: list[list[Sample]] = [[] for _ in reqs]
        async with contextlib.aclosing(tm.stream(reqs)) as events:
            async for i, ev in events:
                req = reqs[i]
                if isinstance(ev, Token):
                    texts[i] += ev.text
                    if ev.sample is not None:
                        samples[i].append(ev.sample)
                    # The finish event right behind the last token goes out in the same chunk.
                    if not req.out.empty():
                        continue
                elif isinstance(ev, Finish):
                    texts[i] += ev.tail
                meta = tm.meta(req, None if isinstance(ev, Token) else ev, samples[i], with_text)
                out = self._output(texts[i], samples[i], meta)
                await resp.write(sse_data({**out, "index": i}))
        await resp.write(DONE)
        return resp

    @staticmethod
    def _output(text: str, samples: list[Sample], meta: dict[str, object]) -> dict[str, object]:
        return {"text": text, "output_ids": [s.token_id for s in samples], "meta_info": meta}

    @staticmethod
    def _abort(ev: Abort) -> web.Response:
        if ev.status == HTTPStatus.BAD_REQUEST:
            return json_response({"error": {"message": ev.message}}, status=400)
        return openai_error(ev.message, int(ev.status), str(int(ev.status)))
