"""One streamed OpenAI-compatible request, timed like sglang.bench_serving times it.

Mirrors `async_request_openai_completions` / `..._chat_completions` in sglang 0.5.23
(`sglang/benchmark/serving.py`): temperature 0, ignore_eos, max_tokens = the wanted output
(but no `best_of: 1`: the smg 1.13 gateway answers 400 "best_of is not supported when
stream is enabled" to any streamed request carrying it);
TTFT is the time to the first chunk carrying text, each later text chunk adds one ITL (the
gap since the previous text chunk), latency runs to the end of the stream. Unlike
bench_serving, which counts any HTTP 200 as a success, a request passes only by the rule of
pdctl.bench.stream (no in-band error, a finish reason, all the tokens asked; the output
length is `usage.completion_tokens`, asked for with `stream_options.include_usage`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pdctl.bench.prompts import Prompt
from pdctl.bench.stream import STREAM_FIELDS, StreamCheck, chunk_text, sse_payload

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RequestOutput:
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_len: int = 0
    start_time: float = 0.0
    error: str = ""


def _payload(endpoint: str, model: str, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.output_len,
        "temperature": 0.0,
        **STREAM_FIELDS,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


async def stream_request(
    session: aiohttp.ClientSession,
    base_url: str,
    endpoint: str,
    model: str,
    prompt: Prompt,
    headers: dict[str, str] | None = None,
) -> RequestOutput:
    out = RequestOutput(prompt_len=prompt.prompt_len)
    check = StreamCheck(prompt.output_len)
    st = time.perf_counter()
    out.start_time = most_recent = st
    try:
        url = base_url.rstrip("/") + ENDPOINTS[endpoint]
        body = _payload(endpoint, model, prompt)
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status} {resp.reason}: {(await resp.text())[:500]}"
                return out
            latency = 0.0
            async for raw in resp.content:
                payload = sse_payload(raw)
                if payload is None:
                    continue
                latency = time.perf_counter() - st
                data = check.feed(payload)
                if data and any(chunk_text(c) for c in data.get("choices") or []):
                    now = time.perf_counter()
                    if out.ttft == 0.0:
                        out.ttft = now - st
                    else:
                        out.itl.append(now - most_recent)
                    most_recent = now
            out.latency = latency
            out.output_len = check.tokens
            failure = check.failure()
            out.success = failure is None
            out.error = failure or ""
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as e:
        out.error = f"{type(e).__name__}: {e}"
    return out
