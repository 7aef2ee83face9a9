"""pdctl.sim scheduler in-process: graph vs eager batches, KV pool queueing, log cadence."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from pdctl.testing.stack import in_process

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}


async def generate_all(env: dict[str, str], n: int, max_new: int, *extra: str) -> list[Any]:
    """n concurrent /generate calls (request i asks for max_new + 5 * i tokens), then
    /metrics."""
    async with (
        in_process("null", {**FAST, **env}, "--enable-metrics", *extra) as server,
        aiohttp.ClientSession(server.url) as http,
    ):

        async def one(i: int) -> Any:
            body = {
                "text": "x" * 40,
                "rid": f"r{i}",
                "sampling_params": {"max_new_tokens": max_new + 5 * i},
            }
            async with http.post("/generate", json=body) as resp:
                return resp.status, await resp.json()

        results = list(await asyncio.gather(*(one(i) for i in range(n))))
        async with http.get("/metrics") as resp:
            results.append(await resp.text())
        return results


def test_batches_above_the_largest_graph_run_eager(capsys: pytest.CaptureFixture[str]) -> None:
    *answers, metrics = asyncio.run(
        generate_all({}, 4, 30, "--cuda-graph-bs-decode", "1", "2", "--decode-log-interval", "1")
    )
    assert all(status == 200 for status, _ in answers)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Decode batch" in ln]
    eager = [ln for ln in lines if "cuda graph: False" in ln]
    graph = [ln for ln in lines if "cuda graph: True" in ln]
    assert eager and graph
    assert all(int(re.search(r"#running-req: (\d+)", ln)[1]) > 2 for ln in eager)  # type: ignore[index]
    assert "sglang:cuda_graph_passes_total{" in metrics and 'mode="decode_none"' in metrics


def test_full_kv_pool_queues_requests(capsys: pytest.CaptureFixture[str]) -> None:
    # Request i needs 10 prompt + 20 + 5 i output tokens; the pool holds two at a time.
    *answers, _ = asyncio.run(generate_all({"PDSIM_KV_POOL_TOKENS": "80"}, 5, 20))
    assert [status for status, _ in answers] == [200] * 5
    prefill_lines = [ln for ln in capsys.readouterr().out.splitlines() if "Prefill batch" in ln]
    queued = [int(re.search(r"#queue-req: (\d+)", ln)[1]) for ln in prefill_lines]  # type: ignore[index]
    assert max(queued) >= 1
    assert max(int(re.search(r"#new-seq: (\d+)", ln)[1]) for ln in prefill_lines) <= 2  # type: ignore[index]


def test_prefill_line_carries_the_previous_batchs_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As SGLang's log_prefill_stats: the first line has no previous batch, so no throughput."""
    asyncio.run(generate_all({"PDSIM_KV_POOL_TOKENS": "80"}, 4, 20))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Prefill batch" in ln]
    rates = [float(re.search(r"input throughput \(token/s\): ([\d.]+)", ln)[1]) for ln in lines]  # type: ignore[index]
    assert len(rates) >= 2 and rates[0] == 0.0 and min(rates[1:]) > 0.0


def test_request_larger_than_the_pool_is_refused() -> None:
    (status, body), _ = asyncio.run(generate_all({"PDSIM_KV_POOL_TOKENS": "20"}, 1, 20))
    assert status == 400
    assert body["error"]["message"] == "Request r0 exceeds the maximum number of tokens: 30 > 20"


def test_decode_lines_every_log_interval(capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(generate_all({}, 1, 41, "--decode-log-interval", "10"))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Decode batch" in ln]
    # 41 tokens: the first comes from the prefill, then 40 decode steps.
    assert len(lines) == 4
