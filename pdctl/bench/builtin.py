"""The builtin driver: the level's requests from this process, through aiohttp."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from pdctl.bench.client import RequestOutput, stream_request
from pdctl.bench.level import Level, Target
from pdctl.bench.metrics import calculate
from pdctl.bench.prompts import random_prompts
from pdctl.errors import PdctlError

KEEP_ERRORS = 5


async def run_level(
    session: aiohttp.ClientSession,
    target: Target,
    level: Level,
    on_request_done: Callable[[], None],
    warmup_requests: int = 1,
) -> dict[str, Any]:
    """bench_serving's flow: warm-up requests at the level's concurrency, then the measured
    run with at most `concurrency` requests in flight."""
    prompts = random_prompts(
        level.num_prompts, level.input_len, level.output_len, level.range_ratio, level.seed
    )
    sem = asyncio.Semaphore(level.concurrency)

    async def one(prompt_index: int) -> RequestOutput:
        async with sem:
            return await stream_request(
                session,
                target.url,
                target.endpoint,
                target.model,
                prompts[prompt_index],
                target.headers,
            )

    if warmup_requests:
        warm = await asyncio.gather(*(one(0) for _ in range(warmup_requests)))
        if not any(o.success for o in warm):
            raise PdctlError(f"warm-up request failed: {warm[0].error}")

    async def measured(i: int) -> RequestOutput:
        out = await one(i)
        on_request_done()
        return out

    start = time.perf_counter()
    outputs = await asyncio.gather(*(measured(i) for i in range(len(prompts))))
    duration = time.perf_counter() - start
    failed = [o.error for o in outputs if not o.success]
    if len(failed) == len(outputs):
        raise PdctlError(f"all {len(outputs)} requests failed; first: {failed[0]}")
    return calculate(outputs, duration) | {"failed": len(failed), "errors": failed[:KEEP_ERRORS]}
