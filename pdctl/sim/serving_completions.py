"""`/v1/completions` (SGLang's `openai/serving_completions.py`)."""

from __future__ import annotations

from aiohttp import web

from .model import count_tokens
from .protocol import first
from .serving_base import OpenAIServing


class OpenAIServingCompletion(OpenAIServing):
    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request, "prompt")
        if isinstance(body, web.Response):
            return body
        prompt = first(body["prompt"])
        tokens = len(prompt) if isinstance(prompt, list) else count_tokens(str(prompt))
        p = self.parsed(body, tokens, "max_tokens", body.get("max_tokens", 16))
        if isinstance(p, web.Response):
            return p
        return await self.run(request, p, "text_completion", "cmpl")
