"""`/v1/completions` (SGLang's `openai/serving_completions.py`).

`logprobs: k` gives each choice the legacy LogProbs `{text_offset (-1 each), token_logprobs,
tokens, top_logprobs}` (a {token: logprob} map of the k likeliest per token; empty for k=0).
A stream sends one chunk per output with its text delta and the logprobs of its tokens; the
last chunk of a choice carries `finish_reason` and `matched_stop`; the usage chunk drops
null fields (model_dump_json(exclude_none=True)).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .engine import Abort, Finish, Req
from .model import count_tokens
from .protocol import Parsed, first
from .sampling import Sample
from .serving_base import Events, OpenAIServing, Pending, stream_error, usage
from .streaming import sse_data
from .tokenizer_manager import Outcome


def completion_logprobs(samples: list[Sample], top: int) -> dict[str, Any]:
    """LogProbs (to_openai_style_logprobs)."""
    return {
        "text_offset": [-1 for _ in samples],
        "token_logprobs": [s.logprob for s in samples],
        "tokens": [s.piece for s in samples],
        "top_logprobs": [{piece: lp for lp, _, piece in s.top} for s in samples] if top else [],
    }


class OpenAIServingCompletion(OpenAIServing):
    object = "text_completion"
    prefix = "cmpl"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request, "prompt")
        if isinstance(body, web.Response):
            return body
        prompt = first(body["prompt"])
        tokens = len(prompt) if isinstance(prompt, list) else count_tokens(str(prompt))
        logprobs = body.get("logprobs")
        p = self.parsed(
            body,
            tokens,
            str(prompt),
            "max_tokens",
            body.get("max_tokens", 16),
            logprobs=logprobs is not None,
            top_logprobs=logprobs,
        )
        if isinstance(p, web.Response):
            return p
        return await self.run(request, p)

    def choice(self, index: int, outcome: Outcome) -> dict[str, Any]:
        params = outcome.req.text.params
        return {
            "index": index,
            "text": outcome.text,
            "logprobs": (
                completion_logprobs(outcome.samples, params.top_logprobs)
                if params.logprobs
                else None
            ),
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
        pending = Pending(len(reqs))
        last = 0
        async for i, ev in events:
            last = i
            if isinstance(ev, Abort):
                await resp.write(stream_error(ev))
                break
            pending.add(i, ev)
            fin = ev if isinstance(ev, Finish) else None
            if fin is None and not reqs[i].out.empty():
                continue  # its finish is right behind: one output, as in SGLang
            text, samples = pending.take(i)
            params = p.sampling
            choice = {
                "index": i,
                "text": text,
                "logprobs": (
                    completion_logprobs(samples, params.top_logprobs)
                    if params.logprobs and samples
                    else None
                ),
                "finish_reason": fin.reason if fin else None,
                "matched_stop": fin.matched if fin else None,
            }
            body = {"id": self.rid(reqs[i]), "object": self.object, **head}
            await resp.write(sse_data({**body, "choices": [choice], "usage": None}))
        if p.include_usage:
            full = usage(p.prompt_tokens, sum(r.generated for r in reqs))
            body = {"id": self.rid(reqs[last]), "object": self.object, **head}
            compact = {k: v for k, v in full.items() if v is not None}
            await resp.write(sse_data({**body, "choices": [], "usage": compact}))
