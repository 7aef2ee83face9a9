"""A concurrency sweep: canary first, then each level under a timeout, results kept whole.

After every level the output file is rewritten atomically with all levels so far: a sweep
cut short by a timeout or ^C leaves the completed levels, never a partial line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from pdctl.bench import builtin, sglang_driver
from pdctl.bench.client import stream_request
from pdctl.bench.level import Level, Target
from pdctl.bench.prompts import Prompt
from pdctl.bench.results import header, write_atomic
from pdctl.bench.sampler import MetricsSampler
from pdctl.errors import PdctlError

CANARY_TIMEOUT_S = 60.0
CANARY = Prompt("Say hello.", 3, 8)
NEEDS_KEY = "the gateway wants its API key: --api-key or $PDSTACK_GATEWAY_API_KEY"


class Progress(Protocol):
    def start_level(self, level: Level, total: int | None) -> None: ...
    def advance(self) -> None: ...
    def end_level(self) -> None: ...


class NoProgress:
    def start_level(self, level: Level, total: int | None) -> None:
        pass

    def advance(self) -> None:
        pass

    def end_level(self) -> None:
        pass


NO_PROGRESS = NoProgress()


@dataclass(frozen=True)
class SweepOptions:
    driver: str = "builtin"  # builtin | sglang
    timeout_s: float = 1800.0  # per level
    warmup_requests: int = 1
    sample_interval_s: float = 1.0
    sglang_python: str = "python3"
    sglang_args: str = ""


async def resolve_model(session: aiohttp.ClientSession, target: Target) -> str:
    """The served model name, as bench_serving finds it: the first of /v1/models."""
    url = target.url
    try:
        wait = aiohttp.ClientTimeout(total=CANARY_TIMEOUT_S)
        models = url.rstrip("/") + "/v1/models"
        async with session.get(models, timeout=wait, headers=target.headers) as resp:
            if resp.status == 401:
                raise PdctlError(f"{models} answered 401: {NEEDS_KEY}")
            body = await resp.json(content_type=None)
            return str(body["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
        raise PdctlError(
            f"{url}/v1/models gave no model ({type(e).__name__}: {e}); pass --model"
        ) from e


async def canary(session: aiohttp.ClientSession, target: Target) -> None:
    """One short streamed request through the PD path: a pair that cannot serve it would
    turn every level into a wall of errors (or a hang) instead of one clear message."""
    try:
        out = await asyncio.wait_for(
            stream_request(
                session, target.url, target.endpoint, target.model, CANARY, target.headers
            ),
            CANARY_TIMEOUT_S,
        )
    except TimeoutError:
        raise PdctlError(
            f"canary request to {target.url} got no answer in {CANARY_TIMEOUT_S:.0f} s: "
            "is the prefill/decode pair healthy (pdctl status)?"
        ) from None
    if not out.success or out.ttft == 0.0:
        hint = f" ({NEEDS_KEY})" if out.error.startswith("HTTP 401") else ""
        raise PdctlError(
            f"canary request to {target.url} failed: {out.error or 'no text streamed back'}{hint}"
        )


async def _run_one(
    session: aiohttp.ClientSession,
    target: Target,
    level: Level,
    opts: SweepOptions,
    progress: Progress,
) -> dict[str, Any]:
    sampler = MetricsSampler(session, list(target.metrics_urls), opts.sample_interval_s)
    sampling = asyncio.create_task(sampler.run()) if target.metrics_urls else None
    progress.start_level(level, level.num_prompts if opts.driver == "builtin" else None)
    try:
        if opts.driver == "builtin":
            run = builtin.run_level(session, target, level, progress.advance, opts.warmup_requests)
        else:
            run = sglang_driver.run_level(opts.sglang_python, target, level, opts.sglang_args)
        try:
            result = await asyncio.wait_for(run, opts.timeout_s)
        except TimeoutError:
            raise PdctlError(
                f"level {level.label} did not finish in {opts.timeout_s:.0f} s "
                "(--timeout); completed levels are kept"
            ) from None
    finally:
        progress.end_level()
        if sampling is not None:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
    extras: dict[str, Any] = {
        "driver": opts.driver,
        "url": target.url,
        "num_prompts": level.num_prompts,
        "seed": level.seed,
    }
    if target.metrics_urls:
        extras["server"] = sampler.summary()
    # bench_serving's own fields win where both have one (the sglang driver's result).
    return header(target, level) | extras | result


async def run_sweep(
    target: Target,
    levels: Sequence[Level],
    opts: SweepOptions,
    progress: Progress = NO_PROGRESS,
    output_file: Path | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if not target.model:
            target = replace(target, model=await resolve_model(session, target))
        await canary(session, target)
        for level in levels:
            rows.append(await _run_one(session, target, level, opts, progress))
            if output_file is not None:
                write_atomic(output_file, rows)
    return rows
