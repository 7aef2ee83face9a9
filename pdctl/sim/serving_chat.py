"""`/v1/chat/completions` (SGLang's `openai/serving_chat.py`).

`logprobs: true` gives each choice `{"content": [{token, bytes, logprob, top_logprobs}]}`
(`top_logprobs` entries for the `top_logprobs` likeliest tokens). A stream sends, per
choice, a role chunk, content chunks (with the logprobs of their tokens; a token that
shows no text yet drops them, as SGLang's plain path does) and, once every choice is done,
one finish chunk per choice with `finish_reason` and `matched_stop`; chunks are msgspec's
(`sse_utils.py`): the delta always has `reasoning_content`, there is no `usage` key.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .model import count_tokens
from .protocol import Parsed, validation_error
from .req import Finish
from .sampling import Sample
from .serving_base import OpenAIServing, Outputs, choice
from .streaming import sse_data
from .tokenizer_manager import Outcome


def chat_logprobs(samples: list[Sample]) -> dict[str, Any]:
    """ChoiceLogprobs (_build_token_logprobs_from_raw)."""

    def entry(piece: str, logprob: float | None) -> dict[str, Any]:
        return {"token": piece, "bytes": list(piece.encode()), "logprob": logprob}

    return {
        "content": [
            {
                **entry(s.piece, s.logprob),
                "top_logprobs": [entry(piece, lp) for lp, _, piece in s.top],
            }
            for s in samples
        ]
    }


class OpenAIServingChat(OpenAIServing):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    prefix = "chatcmpl"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request, "messages")
        if isinstance(body, web.Response):
            return body
        messages = body["messages"]
        if not isinstance(messages, list):
            return validation_error(
                "list_type", ("body", "messages"), "Input should be a valid list", messages
            )
        # Chat template stand-in: "<role>: <content>\n" per message.
        prompt = "".join(
            f"{m.get('role', '')}: {m.get('content', '')}\n"
            for m in messages
            if isinstance(m, dict)
        )
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        p = self.parsed(
            body,
            count_tokens(prompt),
            prompt,
            field,
            body.get(field),
            logprobs=bool(body.get("logprobs")),
            top_logprobs=body.get("top_logprobs"),
        )
        if isinstance(p, web.Response):
            return p
        return await self.run(request, p)

    def choice(self, index: int, outcome: Outcome) -> dict[str, Any]:
        message = {"role": "assistant", "content": outcome.text, "reasoning_content": None}
        logprobs = chat_logprobs(outcome.samples) if outcome.req.text.params.logprobs else None
        return choice(index, {"message": message}, logprobs, outcome.finish)

    async def stream(
        self, resp: web.StreamResponse, p: Parsed, out: Outputs, head: dict[str, Any]
    ) -> None:
        def chunk(
            i: int,
            delta: dict[str, Any],
            logprobs: dict[str, Any] | None = None,
            fin: Finish | None = None,
            rid: int | None = None,
        ) -> bytes:
            return sse_data(
                {
                    "id": self.rid(out.reqs[i if rid is None else rid]),
                    "object": self.chunk_object,
                    **head,
                    "choices": [
                        choice(i, {"delta": {"reasoning_content": None, **delta}}, logprobs, fin)
                    ],
                }
            )

        started: set[int] = set()
        finished: dict[int, Finish] = {}
        async for i, text, samples, fin in out.each(resp):
            if fin is not None:
                finished[i] = fin
            if i not in started:
                started.add(i)
                await resp.write(chunk(i, {"role": "assistant", "content": ""}))
            if text:
                lp = chat_logprobs(samples) if p.sampling.logprobs and samples else None
                await resp.write(chunk(i, {"content": text}, lp))
        for i, fin in finished.items():
            # Finish chunks carry the id of the last output, as in SGLang.
            await resp.write(chunk(i, {}, fin=fin, rid=out.last))
        await self.write_usage(resp, p, out, head)
