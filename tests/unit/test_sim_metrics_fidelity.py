"""The sim's /metrics against the families sglang 0.5.23 defines.

tests/data/sglang_0.5.23_metrics.txt lists every `sglang:*` family of the pinned version
(name, type, label names, histogram buckets), extracted from SGLang's source by
tests/data/extract_sglang_metrics.py. Every family the sim emits must be in it, with the
same type, labels and buckets; the families dashboards and alerts rely on must be emitted.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import NamedTuple

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pdctl.testing.stack import free_port, in_process

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "sglang_0.5.23_metrics.txt"
FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}

REQUIRED = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:gen_throughput",
    "sglang:token_usage",
    "sglang:num_used_tokens",
    "sglang:cache_hit_rate",
    "sglang:is_cuda_graph",
    "sglang:utilization",
    "sglang:max_total_num_tokens",
    "sglang:cuda_graph_passes_total",
    "sglang:realtime_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
    "sglang:queue_time_seconds",
    "sglang:per_stage_req_latency_seconds",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:kv_transfer_latency_ms",
    "sglang:kv_transfer_speed_gb_s",
    "sglang:kv_transfer_bootstrap_ms",
    "sglang:kv_transfer_total_mb",
    "sglang:num_bootstrap_failed_reqs_total",
    "sglang:http_requests_total",
    "sglang:http_responses_total",
}


class Family(NamedTuple):
    type: str
    labels: frozenset[str]
    buckets: tuple[float, ...] | None


def reference() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for line in REFERENCE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, typ, labels, buckets = line.split()
        out[name] = Family(
            typ,
            frozenset() if labels == "-" else frozenset(labels.split(",")),
            None if buckets == "-" else tuple(float(b) for b in buckets.split(",")),
        )
    return out


def emitted(text: str) -> dict[str, Family]:
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels: set[str] = set()
        bounds: list[float] = []
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket"):
                bounds.append(float(s.labels["le"]))
        buckets = tuple(sorted(set(bounds))) if fam.type == "histogram" else None
        out[name] = Family(fam.type, frozenset(labels), buckets)
    return out


async def scrape_pd_pair_and_unified() -> list[str]:
    bootstrap_port = free_port()
    async with (
        in_process(
            "prefill",
            FAST,
            "--enable-metrics",
            "--decode-log-interval",
            "1",
            bootstrap_port=bootstrap_port,
        ) as prefill,
        in_process("decode", FAST, "--enable-metrics", "--decode-log-interval", "1") as decode,
        in_process("null", FAST, "--enable-metrics", "--decode-log-interval", "1") as unified,
        aiohttp.ClientSession() as http,
    ):
        body = {
            "text": "the same body goes to both legs",
            "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port,
            "bootstrap_room": 12345,
        }
        legs = [http.post(f"{s.url}/generate", json=body) for s in (prefill, decode)]
        for resp in await asyncio.gather(*legs):
            assert resp.status == 200, await resp.text()
        # A handshake failure: nobody answers on the bootstrap port.
        async with http.post(
            f"{decode.url}/generate",
            json={**body, "bootstrap_port": free_port(), "bootstrap_room": 1},
        ) as resp:
            assert resp.status == 500
        async with http.post(
            f"{unified.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
        ) as resp:
            await resp.read()
        texts = []
        for server in (prefill, decode, unified):
            async with http.get(f"{server.url}/metrics") as resp:
                texts.append(await resp.text())
        return texts


def test_emitted_families_match_sglang() -> None:
    ref = reference()
    assert len(ref) > 100
    texts = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified(), 60))
    seen: dict[str, Family] = {}
    for text in texts:
        seen.update(emitted(text))
    sglang_families = {n: f for n, f in seen.items() if n.startswith("sglang:")}
    unknown = sorted(set(sglang_families) - set(ref))
    assert not unknown, f"not in sglang 0.5.23: {unknown}"
    for name, fam in sglang_families.items():
        want = ref[name]
        assert fam.type == want.type, name
        assert fam.labels == want.labels, (name, sorted(fam.labels), sorted(want.labels))
        if want.buckets is not None:
            assert fam.buckets is not None
            assert len(fam.buckets) == len(want.buckets), name
            assert all(
                math.isclose(a, b) for a, b in zip(fam.buckets, want.buckets, strict=True)
            ), name
    missing = sorted(REQUIRED - set(sglang_families))
    assert not missing, f"expected from the sim: {missing}"


def test_engine_type_label_follows_the_mode() -> None:
    texts = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified(), 60))
    for text, engine_type in zip(texts, ("prefill", "decode", "unified"), strict=True):
        assert f'engine_type="{engine_type}"' in text
        assert 'model_name="sim"' in text
        assert "_created" not in text  # SGLang's multiprocess registry has no _created series
