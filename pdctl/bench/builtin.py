"""The builtin driver: the level's requests from this process, through aiohttp."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import aiohttp

from pdctl.bench.client import RequestOutput, stream_request
from pdctl.bench.level import Level, Target
from pdctl.bench.metrics import calculate
from pdctl.bench.prompts import random_prompts
from pdctl.errors import PdctlError

KEEP_ERRORS = 5


def arrival_times(level: Level) -> list[float]:
    """Seconds after the start at which each request is sent: bench_serving's Poisson
    process (the first at once, then exponential gaps at the rate), all at 0 without one."""
    if level.rate is None:
        return [0.0] * level.num_prompts
    rng = random.Random(level.seed)
    return [0.0, *accumulate(rng.expovariate(level.rate) for _ in range(level.num_prompts - 1))]


async def run_requests(
    session: aiohttp.ClientSession,
    target: Target,
    level: Level,
    on_request_done: Callable[[], None],
    warmup_requests: int = 1,
) -> tuple[list[RequestOutput], float, float]:
    """bench_serving's flow: warm-up requests, then the measured run, each request sent at
    its arrival time with at most `concurrency` in flight. The outputs, the start
    (perf_counter) and the duration."""
    prompts = random_prompts(
        level.num_prompts, level.input_len, level.output_len, level.range_ratio, level.seed
    )
    sem = asyncio.Semaphore(level.concurrency or level.num_prompts)

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

    arrivals = arrival_times(level)

    async def measured(i: int) -> RequestOutput:
        await asyncio.sleep(start + arrivals[i] - time.perf_counter())
        out = await one(i)
        on_request_done()
        return out

    start = time.perf_counter()
    outputs = await asyncio.gather(*(measured(i) for i in range(len(prompts))))
    return list(outputs), start, time.perf_counter() - start


async def run_alone(
    target: Target, level: Level, warmup_requests: int = 1
) -> tuple[list[RequestOutput], float, float]:
    """run_requests in a session of its own with no timeout but the connect's (a long stream
    is no failure), for scripts that drive one level at a time."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        return await run_requests(session, target, level, lambda: None, warmup_requests)


async def run_level(
    session: aiohttp.ClientSession,
    target: Target,
    level: Level,
    on_request_done: Callable[[], None],
    warmup_requests: int = 1,
) -> dict[str, Any]:
    """The level's result line: bench_serving's metrics and pdctl's failure count."""
    outputs, _, duration = await run_requests(
        session, target, level, on_request_done, warmup_requests
    )
    failed = [o.error for o in outputs if not o.success]
    if len(failed) == len(outputs):
        raise PdctlError(f"all {len(outputs)} requests failed; first: {failed[0]}")
    return calculate(outputs, duration) | {"failed": len(failed), "errors": failed[:KEEP_ERRORS]}
