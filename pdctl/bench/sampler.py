"""The server side of a level: engine `/metrics` polled while the load runs.

Per poll, over every engine URL: running requests are summed (the batch the decodes carry),
`is_cuda_graph` takes the minimum (one eager engine is enough to matter) and `token_usage`
the maximum (the fullest KV pool). Eager decode steps are counted from the
`cuda_graph_passes_total{mode="decode_none"}` counter between the first and last poll; every
TP rank counts each decode pass (SGLang's batch_result_processor), so one rank's count is
taken per engine, not their sum.
An engine that does not answer is skipped; no sample at all leaves the fields out.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

RUNNING = "sglang:num_running_reqs"
IS_GRAPH = "sglang:is_cuda_graph"
TOKEN_USAGE = "sglang:token_usage"
GRAPH_PASSES = "sglang:cuda_graph_passes_total"
EAGER_MODE = "decode_none"


@dataclass(frozen=True)
class Sample:
    num_running_reqs: float | None
    is_cuda_graph: float | None
    token_usage: float | None
    eager_passes: float | None


def parse_sample(texts: list[str]) -> Sample:
    running: list[float] = []
    graph: list[float] = []
    usage: list[float] = []
    eager: list[float] = []
    for text in texts:
        eager_by_rank: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == RUNNING:
                    running.append(s.value)
                elif s.name == IS_GRAPH:
                    graph.append(s.value)
                elif s.name == TOKEN_USAGE:
                    usage.append(s.value)
                elif s.name == GRAPH_PASSES and s.labels.get("mode") == EAGER_MODE:
                    eager_by_rank[s.labels.get("tp_rank", "0")] = s.value
        if eager_by_rank:
            eager.append(max(eager_by_rank.values()))
    return Sample(
        sum(running) if running else None,
        min(graph) if graph else None,
        max(usage) if usage else None,
        sum(eager) if eager else None,
    )


@dataclass
class MetricsSampler:
    session: aiohttp.ClientSession
    urls: list[str]
    interval: float = 1.0
    samples: list[Sample] = field(default_factory=list)

    async def _poll(self, url: str) -> str | None:
        try:
            timeout = aiohttp.ClientTimeout(total=max(self.interval, 2.0))
            async with self.session.get(url, timeout=timeout) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def sample_once(self) -> None:
        texts = [t for t in await asyncio.gather(*map(self._poll, self.urls)) if t]
        if texts:
            with contextlib.suppress(ValueError):  # not Prometheus text: not an engine
                self.samples.append(parse_sample(texts))

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.sample_once()
            await asyncio.sleep(self.interval)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": len(self.samples)}
        for key in ("num_running_reqs", "is_cuda_graph", "token_usage"):
            values = [v for s in self.samples if (v := getattr(s, key)) is not None]
            if values:
                out[key] = {"max": max(values), "mean": sum(values) / len(values)}
        eager = [s.eager_passes for s in self.samples if s.eager_passes is not None]
        if eager:
            out["eager_decode_passes"] = eager[-1] - eager[0]
        return out
