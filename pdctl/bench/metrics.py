"""bench_serving's result fields computed from timed requests.

A transcription of `calculate_metrics` and the result dict of `benchmark()` in sglang 0.5.23
(`sglang/benchmark/serving.py`), minus what needs the model's tokenizer (the retokenized
counts) or the server (`server_info`, `accept_length`):

- throughputs divide by the level's wall duration (first request sent to last response);
- total_input_tokens sums the dataset's prompt lengths, total_output_tokens the reported ones;
- TPOT per request = (latency - ttft) / (output_len - 1), only for output_len > 1;
- ITL is every gap between text chunks, pooled over requests;
- statistics are numpy's mean / median / population std / linear-interpolation percentiles;
- concurrency = sum of e2e latencies / duration;
- max_output_tokens_per_s and max_concurrent_requests come from 1-second buckets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from pdctl.bench.client import RequestOutput


def _stats(name: str, seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds or [0.0], dtype=float) * 1000.0  # bench_serving: `x or 0`
    return {
        f"mean_{name}_ms": float(np.mean(ms)),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(np.std(ms)),
        f"p90_{name}_ms": float(np.percentile(ms, 90)),
        f"p95_{name}_ms": float(np.percentile(ms, 95)),
        f"p99_{name}_ms": float(np.percentile(ms, 99)),
    }


def _peaks(ok: Sequence[RequestOutput]) -> tuple[float, int]:
    """Peak output tokens in any 1-second bucket and peak requests in flight."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    seconds = math.ceil(max(o.start_time + o.latency for o in ok) - t0) + 1
    tokens = np.zeros(seconds)
    inflight = np.zeros(seconds)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for ts in times:
            b = int(ts - t0)
            if 0 <= b < seconds:
                tokens[b] += 1
        first, last = int(o.start_time - t0), int(o.start_time + o.latency - t0)
        inflight[first : min(last + 1, seconds)] += 1
    return float(tokens.max()), int(inflight.max())


def calculate(outputs: Sequence[RequestOutput], duration: float) -> dict[str, Any]:
    ok = [o for o in outputs if o.success]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_len for o in ok)
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls = [gap for o in ok for gap in o.itl]
    e2e = [o.latency for o in ok]
    peak_tokens, peak_requests = _peaks(ok)
    result: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "total_input_tokens": total_input,
        "total_input_text_tokens": total_input,
        "total_input_vision_tokens": 0,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "input_throughput": total_input / duration,
        "output_throughput": total_output / duration,
        "total_throughput": (total_input + total_output) / duration,
    }
    result |= _stats("e2e_latency", e2e)
    result |= _stats("ttft", ttfts)
    result |= _stats("tpot", tpots)
    result |= _stats("itl", itls)
    result |= {
        "concurrency": sum(e2e) / duration,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    return result


def window_tokens(outputs: Sequence[RequestOutput], start: float, end: float) -> int:
    """Output tokens of the successful requests generated between start and end (perf_counter
    seconds): a steady state's throughput, without a level's ramp-up or tail."""
    tokens = 0
    for o in outputs:
        if not o.success:
            continue
        times = accumulate([o.start_time + o.ttft, *o.itl])
        tokens += sum(1 for t in times if start <= t <= end)
    return tokens
