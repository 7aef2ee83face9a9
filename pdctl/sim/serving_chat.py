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

from .engine import Abort, Finish, Req
from .model import count_tokens
from .protocol import Parsed, validation_error
from .sampling import Sample
from .serving_base import Events, OpenAIServing, Pending, stream_error, usage
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
        params = outcome.req.text.params
        return {
            "index": index,
            "message": {"role": "assistant", "content": outcome.text, "reasoning_content": None},
            "logprobs": chat_logprobs(outcome.samples) if params.logprobs else None,
            "finish_reason": outcome.finish.reason,
            "matched_stop": outcome.finish.matched,
        }

    async def stream(
        self,
        resp: web.StreamResponse,
        p: Parsed,
        reqs: list[Req],
        head: dict[str, Any],
        events: Events,
    ) -> None:
        def chunk(i: int, delta: dict[str, Any], rid: int | None = None, **choice: Any) -> bytes:
            return sse_data(
                {
                    "id": self.rid(reqs[i if rid is None else rid]),
                    "object": "chat.completion.chunk",
                    **head,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"reasoning_content": None, **delta},
                            "logprobs": choice.get("logprobs"),
                            "finish_reason": choice.get("finish_reason"),
                            "matched_stop": choice.get("matched_stop"),
                        }
                    ],
                }
            )

        pending = Pending(len(reqs))
        started: set[int] = set()
        finished: dict[int, Finish] = {}
        last = 0
        async for i, ev in events:
            last = i
            if isinstance(ev, Abort):
                await resp.write(stream_error(ev))
                break
            pending.add(i, ev)
            if isinstance(ev, Finish):
                finished[i] = ev
            elif not reqs[i].out.empty():
                continue  # its finish is right behind: one output, as in SGLang
            if i not in started:
                started.add(i)
                await resp.write(chunk(i, {"role": "assistant", "content": ""}))
            text, samples = pending.take(i)
            if text:
                lp = chat_logprobs(samples) if p.sampling.logprobs and samples else None
                await resp.write(chunk(i, {"content": text}, logprobs=lp))
        for i, fin in finished.items():
            # Finish chunks carry the id of the last output, as in SGLang.
            await resp.write(chunk(i, {}, last, finish_reason=fin.reason, matched_stop=fin.matched))
        if p.include_usage:
            body = {
                "id": self.rid(reqs[last]),
                "object": "chat.completion.chunk",
                **head,
                "choices": [],
                "usage": usage(p.prompt_tokens, sum(r.generated for r in reqs)),
            }
            await resp.write(sse_data(body))
