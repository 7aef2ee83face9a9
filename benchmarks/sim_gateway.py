"""Sustained throughput of a simulated PD pair behind the real gateway, on this machine.

Starts a pdctl.sim prefill and decode and `smg launch --pd-disaggregation` on loopback
ports, drives streamed chat completions at a fixed concurrency for a bounded time and
prints requests/s and output tokens/s (with bench_serving's field names) next to what the
performance model allows. At PDSIM_TIME_SCALE 1 the model is the limit; a smaller scale
(--time-scale 0.1) lets the engines run faster than a GPU would, so the limit becomes this
machine's CPU.

    .venv/bin/python benchmarks/sim_gateway.py --concurrency 64 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from pdctl.sim.args import resolve
from pdctl.sim.model import StepModel
from pdctl.testing.stack import SimProc, smg_binary, start_gateway

ENGINE_ARGS = (
    "--mem-fraction-static",
    "0.60",
    "--context-length",
    "8192",
    "--cuda-graph-max-bs-decode",
    "96",
    "--max-running-requests",
    "128",
)


async def one_request(
    http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, ttfts: list[float]
) -> int:
    """Output tokens of one streamed chat completion (0 when it failed)."""
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    start = time.monotonic()
    tokens = 0
    finished = False
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return 0
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if not choices:
                continue
            if choices[0].get("delta", {}).get("content"):
                if tokens == 0:
                    ttfts.append(time.monotonic() - start)
                tokens += 1
            finished = finished or bool(choices[0].get("finish_reason"))
    return tokens if finished else 0


async def drive(
    url: str, concurrency: int, duration: float, input_len: int, max_tokens: int
) -> dict[str, float]:
    prompt = "x" * (4 * input_len)  # the sim counts 4 characters per token
    ttfts: list[float] = []
    completed = failed = out_tokens = 0
    deadline = time.monotonic() + duration
    timeout = aiohttp.ClientTimeout(total=duration + 120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:

        async def worker() -> None:
            nonlocal completed, failed, out_tokens
            while time.monotonic() < deadline:
                try:
                    n = await one_request(http, url, prompt, max_tokens, ttfts)
                except (aiohttp.ClientError, TimeoutError):
                    n = 0
                if n:
                    completed += 1
                    out_tokens += n
                else:
                    failed += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return {
        "duration": round(elapsed, 2),
        "completed": completed,
        "failed": failed,
        "total_input_tokens": completed * input_len,
        "total_output_tokens": out_tokens,
        "request_throughput": round(completed / elapsed, 2),
        "output_throughput": round(out_tokens / elapsed, 1),
        "mean_ttft_ms": round(statistics.mean(ttfts) * 1000, 1) if ttfts else 0.0,
        "median_ttft_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else 0.0,
        "max_concurrency": concurrency,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--time-scale", type=float, default=1.0, help="PDSIM_TIME_SCALE")
    args = p.parse_args()
    binary = smg_binary()
    if binary is None:
        print("smg is not installed (scripts/setup.sh installs it into .venv)", file=sys.stderr)
        return 2
    env = {"PDSIM_TIME_SCALE": str(args.time_scale), "PDSIM_STARTUP_DELAY_S": "1"}
    cfg = resolve(["--model-path", "m", *ENGINE_ARGS], env)
    k = cfg.knobs
    model = StepModel(k.step_a_ms, k.step_b_ms, k.eager_penalty, cfg.decode_buckets)
    with tempfile.TemporaryDirectory(prefix="pdsim-bench-") as tmp:
        logs = Path(tmp)
        sims = [
            SimProc.create(mode, logs, env, extra=ENGINE_ARGS) for mode in ("prefill", "decode")
        ]
        gateway = None
        try:
            for sim in sims:
                sim.start()
            for sim in sims:
                sim.wait_healthy(60)
            gateway = start_gateway(binary, sims[:1], sims[1:], logs, "--disable-retries")
            gateway.wait_ready(60)
            result = asyncio.run(
                drive(gateway.url, args.concurrency, args.duration, args.input_len, args.max_tokens)
            )
        finally:
            if gateway is not None:
                gateway.stop()
            for sim in sims:
                sim.stop()
    result["model_limit_output_throughput"] = round(
        model.throughput(args.concurrency) / args.time_scale, 1
    )
    result["time_scale"] = args.time_scale
    print(json.dumps(result))
    print(
        f"{result['request_throughput']} req/s, {result['output_throughput']} output tok/s "
        f"at concurrency {args.concurrency} (model allows "
        f"{result['model_limit_output_throughput']} tok/s); {result['failed']} failed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
