"""When a streamed completion failed: the one rule for `pdctl bench`, the tests' and the
benchmarks' load (pdctl.testing.stack.constant_load).

A request fails when its status is not 200, its stream carries an error, or it ends without
a finish reason or short of the tokens asked (the load sends `ignore_eos`, so every request
must produce `max_tokens`). The status check belongs to the caller; `StreamCheck` judges the
stream. HTTP 200 alone proves nothing: SGLang answers 200 before the first token, and a
request aborted later (a decode that loses its prefill, a timeout) arrives in-band as
`data: {"error": {"object": "error", "message": …, "code": 500}}` (serving_base.py
`create_streaming_error_response`, sglang 0.5.23); a decode killed mid-stream simply cuts
the stream. Tokens are counted from `usage.completion_tokens` (sent with
`stream_options.include_usage`), else one per content chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The body fields every streamed load request carries; the caller adds prompt and max_tokens.
STREAM_FIELDS: dict[str, Any] = {
    "stream": True,
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}


@dataclass
class StreamCheck:
    wanted: int  # max_tokens asked
    finish_reason: str | None = None
    error: str | None = None
    content_chunks: int = 0
    usage_tokens: int | None = None

    def feed(self, payload: str) -> dict[str, Any] | None:
        """One SSE `data:` payload; the parsed chunk, None for `[DONE]` or an error."""
        if payload == "[DONE]":
            return None
        try:
            data = json.loads(payload)
        except ValueError:
            self.error = f"unreadable stream chunk: {payload[:200]}"
            return None
        if not isinstance(data, dict):
            self.error = f"unexpected stream chunk: {payload[:200]}"
            return None
        if "error" in data or data.get("object") == "error":
            err = data.get("error", data)
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:500]
            return None
        usage = data.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        for choice in data.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            if chunk_text(choice):
                self.content_chunks += 1
        return data

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.content_chunks

    def failure(self) -> str | None:
        """Why the stream failed, None when it passed."""
        if self.error is not None:
            return f"error in the stream: {self.error}"
        if self.finish_reason is None:
            return f"stream ended without a finish reason after {self.tokens} tokens"
        if self.tokens < self.wanted:
            return (
                f"short: {self.tokens} of {self.wanted} tokens (finish_reason {self.finish_reason})"
            )
        return None


def chunk_text(choice: dict[str, Any]) -> str:
    """A chat delta's content or a completion's text."""
    return str((choice.get("delta") or {}).get("content") or choice.get("text") or "")


def sse_payload(line: bytes) -> str | None:
    """The payload of an SSE `data:` line; None for blank lines, comments and other fields."""
    text = line.decode().strip()
    return text[len("data:") :].strip() if text.startswith("data:") else None
