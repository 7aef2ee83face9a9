"""`/v1/chat/completions` (SGLang's `openai/serving_chat.py`)."""

from __future__ import annotations

from aiohttp import web

from .model import count_tokens
from .protocol import validation_error
from .serving_base import OpenAIServing


class OpenAIServingChat(OpenAIServing):
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
        p = self.parsed(body, count_tokens(prompt), field, body.get(field))
        if isinstance(p, web.Response):
            return p
        return await self.run(request, p, "chat.completion", "chatcmpl")
