"""The `sglang:*` Prometheus families the simulator emits, as sglang 0.5.23 defines them.

Names, types, label names and buckets come from `sglang/srt/observability/metrics_collector.py`
(SchedulerMetricsCollector, TokenizerMetricsCollector) and `http_request_metrics.py`, declared
as data in metrics_families.py; the full list of the pinned version is
tests/data/sglang_0.5.23_metrics.txt and tests/unit/test_sim_metrics_fidelity.py keeps this
module a subset of it. SGLang serves
them from a multiprocess registry, which has no `_created` series; neither does this one.

Who writes what follows tests/data/sglang_0.5.23_recording.txt (derived from SGLang's call
sites): every TP rank has its own scheduler collector, so the record helpers come in three
kinds. `sched_*` is the rank-0 path (`current_scheduler_metrics_enabled`: log_stats gauges,
realtime tokens, prefill CUDA-graph passes); `rank_*` and `constant` are written by every
rank (`enable_metrics`: failure, retraction and decode-pass counters, the per-request
histograms, emit_constants); `tok_*` is the single tokenizer process, which in PD prefill
never observes TTFT, ITL or TPOT.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from .metrics_families import FAMILIES
from .mode import DisaggregationMode

prometheus_client.disable_created_metrics()


class _Written(CollectorRegistry):
    """SGLang's multiprocess registry only shows families with a written sample."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self.source = registry

    def collect(self) -> Iterator[Metric]:
        return (m for m in self.source.collect() if m.samples)


# model_executor/graph_memory_usage.py GRAPH_MEMORY_USAGE_KEYS: every phase is written,
# 0 where nothing was captured (graph memory per rank, capture time by the tokenizer).
GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)


@dataclass(frozen=True)
class Startup:
    """What a server's start-up resolved and measured: emit_constants' and
    emit_startup_time's inputs. SGLang's "GB" are GiB (memory_pool.py divides by 1024**3)."""

    pool_tokens: int
    page_size: int
    context_len: int
    weights_gb: float
    kv_gb: float
    load_weight_s: float
    cuda_graph_s: Mapping[str, float]  # capture time by phase (missing: 0)
    graph_gb: Mapping[str, float]  # captured graphs' memory by phase (missing: 0)
    available_gb: float  # free GPU memory once the scheduler is up
    total_s: float


class SimMetrics:
    """Scheduler families carry model_name, engine_type, tp_rank, pp_rank, moe_ep_rank;
    tokenizer families carry model_name, engine_type (plus per-family extras)."""

    enabled = True
    # One attribute per family (metrics_families.FAMILIES registers them).
    num_running_reqs: Gauge
    num_queue_reqs: Gauge
    gen_throughput: Gauge
    cache_hit_rate: Gauge
    token_usage: Gauge
    num_used_tokens: Gauge
    kv_used_tokens: Gauge
    kv_available_tokens: Gauge
    is_cuda_graph: Gauge
    utilization: Gauge
    fwd_occupancy: Gauge
    num_prefill_bootstrap_queue_reqs: Gauge
    num_prefill_inflight_queue_reqs: Gauge
    num_decode_prealloc_queue_reqs: Gauge
    num_decode_transfer_queue_reqs: Gauge
    pending_prealloc_token_usage: Gauge
    num_decode_host_receive_queue_reqs: Gauge
    num_decode_deferred_kv_release_reqs: Gauge
    max_total_num_tokens: Gauge
    page_size: Gauge
    num_pages: Gauge
    context_len: Gauge
    weight_memory_usage_gb: Gauge
    kv_cache_memory_usage_gb: Gauge
    startup_available_gpu_memory_gb: Gauge
    graph_memory_usage_gb: Gauge
    num_retracted_reqs: Gauge
    num_paused_reqs: Gauge
    num_retracted_requests: Counter
    num_retracted_input_tokens: Counter
    num_retracted_output_tokens: Counter
    scheduler_idle_seconds: Counter
    cuda_graph_passes: Counter
    realtime_tokens: Counter
    num_bootstrap_failed_reqs: Counter
    num_transfer_failed_reqs: Counter
    num_prefill_retries: Counter
    decode_deferred_kv_release: Counter
    decode_deferred_kv_release_seconds: Histogram
    cross_group_transfers: Counter
    queue_time: Histogram
    per_stage_req_latency: Histogram
    kv_transfer_latency_ms: Histogram
    kv_transfer_speed_gb_s: Histogram
    kv_transfer_bootstrap_ms: Histogram
    kv_transfer_alloc_ms: Histogram
    kv_transfer_total_mb: Histogram
    startup_time_seconds: Gauge
    startup_cuda_graph_time_seconds: Gauge
    prompt_tokens: Counter
    generation_tokens: Counter
    num_requests: Counter
    num_aborted_requests: Counter
    prompt_tokens_histogram: Histogram
    uncached_prompt_tokens_histogram: Histogram
    generation_tokens_histogram: Histogram
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    request_time_per_output_token: Histogram
    e2e_request_latency: Histogram
    http_requests: Counter
    http_responses: Counter
    http_requests_active: Gauge

    def __init__(self, model_name: str, mode: DisaggregationMode, tp_size: int = 1) -> None:
        engine_type = mode.engine_type
        # tokenizer_manager.collect_metrics: "PD prefill workers never observe TTFT, so they
        # never reach ITL"; TPOT is None there too.
        self._tokenizer_skips_latency = mode is DisaggregationMode.PREFILL
        self.registry = CollectorRegistry(auto_describe=True)
        self.exposed = _Written(self.registry)
        self.sched = {
            "model_name": model_name,
            "engine_type": engine_type,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.set_tp_size(tp_size)
        self.tok = {"model_name": model_name, "engine_type": engine_type}
        # Gauges of SGLang's default multiprocess mode ("all") carry the writer's pid.
        self.pid = {"pid": str(os.getpid())}
        for family in FAMILIES:
            setattr(self, family.attr, family.register(self.registry))

    def set_tp_size(self, tp_size: int) -> None:
        self.ranks = [{**self.sched, "tp_rank": str(rank)} for rank in range(max(tp_size, 1))]

    def set_static(self, startup: Startup) -> None:
        """emit_constants: every rank (scheduler.py emit_metrics_constants, enable_metrics);
        num_pages is the pool over the page size."""
        for gauge, value in (
            (self.max_total_num_tokens, startup.pool_tokens),
            (self.page_size, startup.page_size),
            (self.num_pages, startup.pool_tokens // startup.page_size),
            (self.context_len, startup.context_len),
            (self.weight_memory_usage_gb, startup.weights_gb),
            (self.kv_cache_memory_usage_gb, startup.kv_gb),
            (self.startup_available_gpu_memory_gb, startup.available_gb),
        ):
            for labels in self.ranks:
                gauge.labels(**labels).set(value)
        for phase in GRAPH_PHASES:
            for labels in self.ranks:
                self.graph_memory_usage_gb.labels(**labels, phase=phase).set(
                    startup.graph_gb.get(phase, 0.0)
                )
        self._emit_startup_time(startup)

    def _emit_startup_time(self, startup: Startup) -> None:
        """tokenizer_manager.set_startup_time -> emit_startup_time (the tokenizer process);
        startup_time.py takes each phase's slowest rank, which in the sim are all alike.
        The sim allocates its KV pool at once (kv_cache_allocation 0); the scheduler is up
        when the capture ends, the tokenizer when the scheduler is."""
        for phase, seconds in (
            ("load_weight", startup.load_weight_s),
            ("kv_cache_allocation", 0.0),
            ("scheduler_e2e", startup.total_s),
            ("tokenizer_e2e", startup.total_s),
        ):
            self.startup_time_seconds.labels(**self.tok, phase=phase).set(seconds)
        for phase in GRAPH_PHASES:
            self.startup_cuda_graph_time_seconds.labels(**self.tok, phase=phase).set(
                startup.cuda_graph_s.get(phase, 0.0)
            )

    def sched_gauge(self, gauge: Gauge, value: float, **extra: str) -> None:
        """log_stats: rank 0 only."""
        gauge.labels(**self.sched, **extra).set(value)

    def sched_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        """A counter under `current_scheduler_metrics_enabled`: rank 0 only."""
        counter.labels(**self.sched, **extra).inc(amount)

    def rank_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        """A counter under plain `enable_metrics`: each TP rank counts the same event."""
        for labels in self.ranks:
            counter.labels(**labels, **extra).inc(amount)

    def rank_observe(self, hist: Histogram, value: float, **extra: str) -> None:
        """Per-request histograms (req_time_stats): every rank observes its own copy."""
        for labels in self.ranks:
            hist.labels(**labels, **extra).observe(value)

    def observe_kv_transfer(self, total_bytes: int, seconds: float) -> None:
        """req_time_stats.compute_and_observe_kv_transfer_metrics: MiB and GiB/s."""
        if seconds <= 0:
            return
        mb = total_bytes / 2**20
        self.rank_observe(self.kv_transfer_latency_ms, seconds * 1000)
        self.rank_observe(self.kv_transfer_speed_gb_s, mb / 1024 / seconds)
        self.rank_observe(self.kv_transfer_total_mb, mb)

    def _tokenizer_records(self, metric: Counter | Histogram) -> bool:
        return not self._tokenizer_skips_latency or metric not in (
            self.time_to_first_token,
            self.inter_token_latency,
            self.request_time_per_output_token,
        )

    def tok_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        if self._tokenizer_records(counter):
            counter.labels(**self.tok, **extra).inc(amount)

    def tok_observe(self, hist: Histogram, value: float, **extra: str) -> None:
        if self._tokenizer_records(hist):
            hist.labels(**self.tok, **extra).observe(value)


class NoMetrics(SimMetrics):
    """Without --enable-metrics: the families exist (so call sites need no guard) but nothing
    is recorded and nothing is served."""

    enabled = False

    def set_static(self, startup: Startup) -> None:
        pass

    def sched_gauge(self, gauge: Gauge, value: float, **extra: str) -> None:
        pass

    def sched_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        pass

    def rank_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        pass

    def rank_observe(self, hist: Histogram, value: float, **extra: str) -> None:
        pass

    def tok_inc(self, counter: Counter, amount: float = 1.0, **extra: str) -> None:
        pass

    def tok_observe(self, hist: Histogram, value: float, **extra: str) -> None:
        pass
