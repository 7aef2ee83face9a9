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

from .model import count_tokens
from .protocol import Parsed, first
from .sampling import Sample
from .serving_base import OpenAIServing, Outputs, choice
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
    chunk_object = "text_completion"
    prefix = "cmpl"
    usage_drops_null = True

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
        lp = completion_logprobs(outcome.samples, params.top_logprobs) if params.logprobs else None
        return choice(index, {"text": outcome.text}, lp, outcome.finish)

    async def stream(
        self, resp: web.StreamResponse, p: Parsed, out: Outputs, head: dict[str, Any]
    ) -> None:
        params = p.sampling
        async for i, text, samples, fin in out.each(resp):
            lp = (
                completion_logprobs(samples, params.top_logprobs)
                if params.logprobs and samples
                else None
            )
            body = {"id": self.rid(out.reqs[i]), "object": self.chunk_object, **head}
            chunk = choice(i, {"text": text}, lp, fin)
            await resp.write(sse_data({**body, "choices": [chunk], "usage": None}))
        await self.write_usage(resp, p, out, head)
