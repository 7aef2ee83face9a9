"""The sim's /metrics against the families sglang 0.5.23 defines and who records them.

tests/data/sglang_0.5.23_metrics.txt lists every `sglang:*` family of the pinned version
(name, type, label names, histogram buckets, the flags that create it), extracted from
SGLang's source by tests/data/extract_sglang_metrics.py. Every family the sim emits must be
in it, with the same type, labels and buckets; the families dashboards and alerts rely on
must be emitted.

tests/data/sglang_0.5.23_recording.txt (tests/data/extract_sglang_recording.py) says per
family which TP ranks write it and in which disaggregation modes; the sim, run at TP4, must
write each family only in those modes and from those ranks.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import NamedTuple, get_type_hints

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pdctl.sim.metrics import SimMetrics
from pdctl.sim.metrics_families import FAMILIES
from pdctl.sim.mode import DisaggregationMode
from pdctl.testing.stack import free_port, in_process

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "sglang_0.5.23_metrics.txt"
RECORDING = REFERENCE.with_name("sglang_0.5.23_recording.txt")
TP = 4
FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}
# A decode room the prefill never sees fails after SGLang's waiting timeout (1 s here).
WAITING_TIMEOUT_S = 100

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
    "sglang:kv_transfer_alloc_ms",
    "sglang:kv_transfer_total_mb",
    "sglang:num_retracted_reqs",
    "sglang:num_paused_reqs",
    "sglang:num_decode_host_receive_queue_reqs",
    "sglang:pending_prealloc_token_usage",
    "sglang:scheduler_idle_seconds_total",
    "sglang:num_bootstrap_failed_reqs_total",
    "sglang:num_prefill_retries_total",
    "sglang:num_transfer_failed_reqs_total",
    "sglang:num_decode_deferred_kv_release_reqs",
    "sglang:decode_deferred_kv_release_total",
    "sglang:decode_deferred_kv_release_seconds",
    "sglang:num_aborted_requests_total",
    "sglang:fwd_occupancy",
    "sglang:num_pages",
    "sglang:page_size",
    "sglang:graph_memory_usage_gb",
    "sglang:startup_available_gpu_memory_gb",
    "sglang:startup_time_seconds",
    "sglang:startup_cuda_graph_time_seconds",
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
        name, typ, labels, buckets, _flags = line.split()
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


class Recording(NamedTuple):
    ranks: frozenset[str]  # every, rank0, server
    modes: frozenset[str]  # null, prefill, decode


def recording() -> dict[str, Recording]:
    out: dict[str, Recording] = {}
    for line in RECORDING.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _collector, ranks, modes, _sites = line.split()
            out[name] = Recording(frozenset(ranks.split(",")), frozenset(modes.split(",")))
    return out


def room_request(text: str, bootstrap_port: int, room: int) -> dict[str, object]:
    """A /generate body for one PD room of the prefill at 127.0.0.1:bootstrap_port."""
    return {
        "text": text,
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": room,
    }


async def scrape_pd_pair_and_unified(*extra: str) -> list[str]:
    bootstrap_port = free_port()
    flags = ("--enable-metrics", "--decode-log-interval", "1", *extra)
    # SGLang's test hook retries every prefill once (an optimistic attempt is left).
    retry = {**FAST, "SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB": "1"}
    retry_flags = (*flags, "--optimistic-prefill-attempts", "2")
    decode_env = {**FAST, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)}
    async with (
        in_process("prefill", retry, *retry_flags, bootstrap_port=bootstrap_port) as prefill,
        in_process("decode", decode_env, *flags) as decode,
        in_process("null", FAST, *flags) as unified,
        aiohttp.ClientSession() as http,
    ):
        body = room_request("the same body goes to both legs", bootstrap_port, 12345)
        legs = [http.post(f"{s.url}/generate", json=body) for s in (prefill, decode)]
        for resp in await asyncio.gather(*legs):
            assert resp.status == 200, await resp.text()
        # A handshake failure: nobody answers on the bootstrap port.
        async with http.post(
            f"{decode.url}/generate",
            json={**body, "bootstrap_port": free_port(), "bootstrap_room": 1},
        ) as resp:
            assert resp.status == 500
        # A transfer failure with the prefill alive: the decode holds the room's KV until
        # the prefill acks the abort (deferred release, outcome "drained").
        async with http.post(f"{decode.url}/generate", json={**body, "bootstrap_room": 2}) as resp:
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


def tp_ranks(text: str) -> dict[str, set[str | None]]:
    """Family -> the tp_rank values of its samples (None: the family has no tp_rank)."""
    out: dict[str, set[str | None]] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = {s.labels.get("tp_rank") for s in fam.samples}
    return out


def test_each_family_is_recorded_in_the_modes_and_ranks_sglang_records_it() -> None:
    rec = recording()
    texts = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified("--tp-size", str(TP)), 60))
    every = {str(r) for r in range(TP)}
    seen_modes: dict[str, set[str]] = {}
    for text, mode in zip(texts, ("prefill", "decode", "null"), strict=True):
        for name, ranks in tp_ranks(text).items():
            if not name.startswith("sglang:"):
                continue
            want = rec[name]
            assert mode in want.modes, f"{name}: sglang records it in {sorted(want.modes)}"
            seen_modes.setdefault(name, set()).add(mode)
            if want.ranks == {"server"}:
                assert ranks == {None}, name
            elif want.ranks == {"rank0"}:
                assert ranks == {"0"}, (name, mode, ranks)
            elif want.ranks == {"every"}:
                assert ranks == every, (name, mode, ranks)
            else:  # some call sites on every rank, others on rank 0 only
                assert ranks in ({"0"}, every), (name, mode, ranks)
    # Families the scenario drives in each mode: the sim records them wherever SGLang does.
    event_driven = {
        "sglang:num_bootstrap_failed_reqs_total",  # only the decode's handshake fails here
        "sglang:num_transfer_failed_reqs_total",  # and only the decode's transfer
        "sglang:num_aborted_requests_total",
    }
    for name, modes in seen_modes.items():
        if name not in event_driven:
            assert modes == rec[name].modes, (name, sorted(modes), sorted(rec[name].modes))
    assert "sglang:time_to_first_token_seconds" not in tp_ranks(texts[0])
    # The one planted handshake failure reads 1 on each rank: a sum over ranks would say TP.
    failed = [
        s.value
        for fam in text_string_to_metric_families(texts[1])
        for s in fam.samples
        if s.name == "sglang:num_bootstrap_failed_reqs_total"
    ]
    assert failed == [1.0] * TP


def test_decode_passes_come_from_every_rank_prefill_passes_from_rank_0() -> None:
    """batch_result_processor counts decode passes under enable_metrics (each rank);
    metrics_reporter counts prefill passes under current_scheduler_metrics_enabled."""
    texts = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified("--tp-size", str(TP)), 60))
    ranks: dict[str, set[str]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name == "sglang:cuda_graph_passes":
                for s in fam.samples:
                    ranks.setdefault(s.labels["mode"], set()).add(s.labels["tp_rank"])
    assert ranks["prefill_none"] == {"0"}
    assert ranks["decode_cuda_graph"] == {str(r) for r in range(TP)}


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """One sample name's values by label set (model labels included)."""
    return {
        frozenset(s.labels.items()): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def by(label: str, values: dict[frozenset[tuple[str, str]], float]) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in values.items()}


def test_a_failed_transfer_holds_its_kv_until_the_live_prefill_acks() -> None:
    """decode.py resolve_deferred_releases: the scenario's one transfer failure (prefill
    alive) resolves as "drained" and the held-requests gauge is back to 0."""
    _, decode, unified = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified(), 60))
    assert list(samples(decode, "sglang:num_transfer_failed_reqs_total").values()) == [1.0]
    outcomes = by("outcome", samples(decode, "sglang:decode_deferred_kv_release_total"))
    assert outcomes == {"drained": 1.0}
    assert list(samples(decode, "sglang:decode_deferred_kv_release_seconds_count").values()) == [
        1.0
    ]
    assert list(samples(decode, "sglang:num_decode_deferred_kv_release_reqs").values()) == [0.0]
    assert not samples(unified, "sglang:decode_deferred_kv_release_total")


def test_startup_constants_follow_the_pool_and_the_capture() -> None:
    """emit_constants and emit_startup_time: pages are the pool over the page size; only
    the decode captured graphs (a prefill captures none), in the decode phase."""
    prefill, decode, _ = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified(), 60))
    for text in (prefill, decode):
        [pool] = samples(text, "sglang:max_total_num_tokens").values()
        [page] = samples(text, "sglang:page_size").values()
        assert list(samples(text, "sglang:num_pages").values()) == [pool // page]
        assert set(by("phase", samples(text, "sglang:startup_time_seconds"))) == {
            "load_weight",
            "kv_cache_allocation",
            "scheduler_e2e",
            "tokenizer_e2e",
        }
    decode_graphs = by("phase", samples(decode, "sglang:graph_memory_usage_gb"))
    assert decode_graphs["decode"] > 0
    assert sum(decode_graphs.values()) == decode_graphs["decode"]
    assert len(decode_graphs) == 6
    assert set(by("phase", samples(prefill, "sglang:graph_memory_usage_gb")).values()) == {0.0}
    [available] = samples(decode, "sglang:startup_available_gpu_memory_gb").values()
    assert available > 0


async def deferred_release_after_losing_the_prefill(env: dict[str, str]) -> str:
    """A decode room the prefill never sees waits for its KV; the prefill then stops, the
    heartbeat drops it and the transfer fails with no prefill left to ack the abort. The
    decode's /metrics once a deferred release resolved (or 2 s after the failure)."""
    bootstrap_port = free_port()
    async with (
        in_process("decode", {**FAST, **env}, "--enable-metrics") as decode,
        aiohttp.ClientSession() as http,
    ):
        async with in_process("prefill", FAST, bootstrap_port=bootstrap_port):
            body = room_request("nobody sends this room's KV", bootstrap_port, 7)
            answer = asyncio.ensure_future(http.post(f"{decode.url}/generate", json=body))
            await asyncio.sleep(0.3)  # bootstrapped, waiting in the transfer queue
        async with await answer as resp:
            assert resp.status == 500, await resp.text()
        for _ in range(40):
            async with http.get(f"{decode.url}/metrics") as resp:
                text = await resp.text()
            if "sglang:decode_deferred_kv_release_total" in text:
                break
            await asyncio.sleep(0.05)
        return text


def test_a_failed_transfer_of_a_lost_prefill_holds_its_kv_until_the_timeout() -> None:
    text = asyncio.run(asyncio.wait_for(deferred_release_after_losing_the_prefill({}), 30))
    assert list(samples(text, "sglang:num_transfer_failed_reqs_total").values()) == [1.0]
    outcomes = by("outcome", samples(text, "sglang:decode_deferred_kv_release_total"))
    assert outcomes == {"timeout": 1.0}
    # Held for SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (30 s) and released at
    # the first check past the deadline, as resolve_deferred_releases does (at 1/100 time
    # scale a busy test machine's late wake-up adds whole simulated seconds: the 60 s bucket).
    [held] = samples(text, "sglang:decode_deferred_kv_release_seconds_sum").values()
    assert held >= 30.0
    buckets = by("le", samples(text, "sglang:decode_deferred_kv_release_seconds_bucket"))
    assert buckets["10.0"] == 0.0
    assert buckets["60.0"] == 1.0


async def occupancy_while_decoding_and_after(env: dict[str, str]) -> tuple[float, float]:
    """sglang:fwd_occupancy mid-decode (a long request, a stats line every step) and once
    the server is idle again."""
    async with (
        in_process("null", {**FAST, **env}, "--enable-metrics", "--decode-log-interval", "1") as s,
        aiohttp.ClientSession() as http,
    ):

        async def occupancy() -> float:
            async with http.get(f"{s.url}/metrics") as resp:
                [value] = samples(await resp.text(), "sglang:fwd_occupancy").values()
                return value

        body = {"text": "a long answer", "sampling_params": {"max_new_tokens": 4000}}
        answer = asyncio.ensure_future(http.post(f"{s.url}/generate", json=body))
        await asyncio.sleep(0.2)
        during = await occupancy()
        async with await answer as resp:
            assert resp.status == 200
        await asyncio.sleep(0.1)
        return during, await occupancy()


def test_forward_occupancy_needs_the_device_timer_and_turns_nan_at_idle() -> None:
    """metrics_reporter: without SGLANG_ENABLE_METRICS_DEVICE_TIMER every stats line
    publishes NaN; with it, GPU time over wall time while decoding, NaN again at idle."""
    timed = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
    during, idle = asyncio.run(asyncio.wait_for(occupancy_while_decoding_and_after(timed), 30))
    assert 0 < during <= 100
    assert math.isnan(idle)
    during, idle = asyncio.run(asyncio.wait_for(occupancy_while_decoding_and_after({}), 30))
    assert math.isnan(during) and math.isnan(idle)


def test_without_deferred_release_a_failed_transfer_frees_its_kv_at_once() -> None:
    off = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "0"}
    text = asyncio.run(asyncio.wait_for(deferred_release_after_losing_the_prefill(off), 30))
    assert list(samples(text, "sglang:num_transfer_failed_reqs_total").values()) == [1.0]
    assert not samples(text, "sglang:decode_deferred_kv_release_total")
    assert list(samples(text, "sglang:num_decode_deferred_kv_release_reqs").values()) == [0.0]


def test_every_declared_family_is_a_typed_attribute_of_the_metrics() -> None:
    """metrics_families.FAMILIES registers the families; SimMetrics' annotations type them for
    its call sites. Both lists name the same attributes with the same kinds."""
    assert get_type_hints(SimMetrics) == {f.attr: f.kind for f in FAMILIES}
    metrics = SimMetrics("m", DisaggregationMode.DECODE)
    assert all(isinstance(getattr(metrics, f.attr), f.kind) for f in FAMILIES)
    assert len({f.served for f in FAMILIES}) == len(FAMILIES)
