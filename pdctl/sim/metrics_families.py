"""The families SimMetrics registers, as data: attribute, type, help and label names, in the
order /metrics serves them. Each comes from sglang 0.5.23's
`sglang/srt/observability/metrics_collector.py` (SchedulerMetricsCollector,
TokenizerMetricsCollector) or `http_request_metrics.py`; tests/unit/test_sim_metrics_fidelity.py
holds them to the pinned version's list (tests/data/sglang_0.5.23_metrics.txt)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .metrics_buckets import (
    DEFERRED_RELEASE_BUCKETS,
    E2E_BUCKETS,
    ITL_BUCKETS,
    KV_BOOTSTRAP_MS_BUCKETS,
    KV_LATENCY_MS_BUCKETS,
    KV_SPEED_BUCKETS,
    KV_TOTAL_MB_BUCKETS,
    QUEUE_TIME_BUCKETS,
    STAGE_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    TTFT_BUCKETS,
)

# Scheduler families carry the writing rank's labels, tokenizer families the model's; the HTTP
# families (http_request_metrics.py) neither.
SCHED = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOK = ("model_name", "engine_type")


@dataclass(frozen=True)
class Family:
    attr: str  # the SimMetrics attribute; the served name is sglang:<attr> unless `name` says
    kind: type[Counter] | type[Gauge] | type[Histogram]
    doc: str
    labels: tuple[str, ...]
    buckets: Sequence[float] = ()
    name: str = ""

    @property
    def served(self) -> str:
        """The family's name (a counter's samples add `_total`)."""
        return self.name or f"sglang:{self.attr}"

    def register(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.kind is Histogram:
            return Histogram(
                self.served, self.doc, self.labels, buckets=self.buckets, registry=registry
            )
        return self.kind(self.served, self.doc, self.labels, registry=registry)


def _gauge(attr: str, doc: str, *extra: str) -> Family:
    return Family(attr, Gauge, doc, (*SCHED, *extra))


def _counter(attr: str, doc: str, *extra: str) -> Family:
    return Family(attr, Counter, doc, (*SCHED, *extra))


# Scheduler gauges (SchedulerMetricsCollector): log_stats writes them on rank 0,
# emit_constants on every rank.
SCHEDULER_GAUGES = (
    _gauge("num_running_reqs", "The number of running requests."),
    _gauge("num_queue_reqs", "The number of requests in the waiting queue."),
    _gauge("gen_throughput", "The generation throughput (token/s)."),
    _gauge("cache_hit_rate", "The prefix cache hit rate."),
    _gauge("token_usage", "The token usage."),
    _gauge("num_used_tokens", "The number of used tokens."),
    _gauge("kv_used_tokens", "KV tokens in use."),
    _gauge("kv_available_tokens", "KV tokens available."),
    _gauge("is_cuda_graph", "Whether the batch is using CUDA graph."),
    _gauge("utilization", "The utilization."),
    _gauge("fwd_occupancy", "Forward pass GPU occupancy percentage."),
    _gauge("num_prefill_bootstrap_queue_reqs", "Requests in the prefill bootstrap queue."),
    _gauge("num_prefill_inflight_queue_reqs", "Requests in the prefill inflight queue."),
    _gauge("num_decode_prealloc_queue_reqs", "Requests in the decode prealloc queue."),
    _gauge("num_decode_transfer_queue_reqs", "Requests in the decode transfer queue."),
    _gauge("pending_prealloc_token_usage", "Token usage of pending preallocations."),
    _gauge("num_decode_host_receive_queue_reqs", "Requests in the decode host receive queue."),
    _gauge(
        "num_decode_deferred_kv_release_reqs", "Failed decode requests whose KV release is held."
    ),
    # emit_constants
    _gauge("max_total_num_tokens", "KV pool size in tokens."),
    _gauge("page_size", "The KV cache page size."),
    _gauge("num_pages", "Number of KV cache pages."),
    _gauge("context_len", "The context length."),
    _gauge("weight_memory_usage_gb", "Weights memory (GB)."),
    _gauge("kv_cache_memory_usage_gb", "KV cache memory (GB)."),
    _gauge("startup_available_gpu_memory_gb", "Available GPU memory in GB at startup."),
    _gauge("graph_memory_usage_gb", "Memory used by captured device graphs in GB.", "phase"),
    # Gauges of SGLang's default multiprocess mode ("all") carry the writer's pid.
    _gauge("num_retracted_reqs", "The number of retracted requests.", "pid"),
    _gauge("num_paused_reqs", "The number of paused requests by async weight sync.", "pid"),
)
# Scheduler counters (served with `_total`).
SCHEDULER_COUNTERS = (
    _counter("num_retracted_requests", "Total number of retracted requests."),
    _counter("num_retracted_input_tokens", "Total number of retracted input tokens."),
    _counter("num_retracted_output_tokens", "Total number of retracted output tokens."),
    _counter(
        "scheduler_idle_seconds",
        "Total wall time while the scheduler has no runnable or queued work.",
    ),
    _counter("cuda_graph_passes", "Forward passes by CUDA graph mode.", "mode"),
    _counter("realtime_tokens", "Tokens processed, by mode.", "mode"),
    _counter("num_bootstrap_failed_reqs", "Requests that failed bootstrapping."),
    _counter("num_transfer_failed_reqs", "Requests whose KV transfer failed."),
    _counter("num_prefill_retries", "Total number of prefill retries."),
    _counter(
        "decode_deferred_kv_release",
        "Total deferred decode KV release resolution attempts.",
        "outcome",
    ),
)
# Scheduler histograms, and the sim's own counter.
SCHEDULER_OTHERS = (
    Family(
        "decode_deferred_kv_release_seconds",
        Histogram,
        "Histogram of time spent holding deferred decode KV releases.",
        SCHED,
        DEFERRED_RELEASE_BUCKETS,
    ),
    # Not an SGLang metric: the sim's proof that the gateway kept requests inside pairs and
    # groups (a pair is a 1P1D group).
    Family(
        "cross_group_transfers",
        Counter,
        "KV transfers this decode took from a prefill outside its pair or group "
        "(PDSIM_PAIR_PARTNER: the group's prefills).",
        SCHED,
        name="pdsim_cross_group_transfers",
    ),
    Family(
        "queue_time",
        Histogram,
        "Histogram of queueing time in seconds.",
        SCHED,
        QUEUE_TIME_BUCKETS,
        "sglang:queue_time_seconds",
    ),
    Family(
        "per_stage_req_latency",
        Histogram,
        "The latency of each stage of requests.",
        (*SCHED, "stage"),
        STAGE_BUCKETS,
        "sglang:per_stage_req_latency_seconds",
    ),
    Family(
        "kv_transfer_latency_ms",
        Histogram,
        "KV transfer latency (ms).",
        SCHED,
        KV_LATENCY_MS_BUCKETS,
    ),
    Family(
        "kv_transfer_speed_gb_s", Histogram, "KV transfer speed (GB/s).", SCHED, KV_SPEED_BUCKETS
    ),
    Family(
        "kv_transfer_bootstrap_ms",
        Histogram,
        "KV transfer bootstrap time (ms).",
        SCHED,
        KV_BOOTSTRAP_MS_BUCKETS,
    ),
    Family(
        "kv_transfer_alloc_ms",
        Histogram,
        "KV transfer allocation wait (ms).",
        SCHED,
        KV_BOOTSTRAP_MS_BUCKETS,
    ),
    Family(
        "kv_transfer_total_mb",
        Histogram,
        "KV transferred per request (MB).",
        SCHED,
        KV_TOTAL_MB_BUCKETS,
    ),
)
STREAMING = (*TOK, "is_streaming")
# TokenizerMetricsCollector: the single tokenizer process.
TOKENIZER = (
    Family(
        "startup_time_seconds",
        Gauge,
        "Engine startup duration by phase in seconds.",
        (*TOK, "phase"),
    ),
    Family(
        "startup_cuda_graph_time_seconds",
        Gauge,
        "CUDA graph capture duration by phase.",
        (*TOK, "phase"),
    ),
    Family("prompt_tokens", Counter, "Number of prefill tokens processed.", STREAMING),
    Family("generation_tokens", Counter, "Number of generation tokens processed.", STREAMING),
    Family("num_requests", Counter, "Number of requests processed.", STREAMING),
    Family("num_aborted_requests", Counter, "Number of requests aborted.", TOK),
    Family(
        "prompt_tokens_histogram",
        Histogram,
        "Histogram of prompt token length.",
        TOK,
        TOKEN_COUNT_BUCKETS,
    ),
    Family(
        "uncached_prompt_tokens_histogram",
        Histogram,
        "Histogram of uncached (compute) prompt token length.",
        TOK,
        TOKEN_COUNT_BUCKETS,
    ),
    Family(
        "generation_tokens_histogram",
        Histogram,
        "Histogram of generation token length.",
        TOK,
        TOKEN_COUNT_BUCKETS,
    ),
    Family(
        "time_to_first_token",
        Histogram,
        "Histogram of time to first token in seconds.",
        STREAMING,
        TTFT_BUCKETS,
        "sglang:time_to_first_token_seconds",
    ),
    Family(
        "inter_token_latency",
        Histogram,
        "Histogram of inter-token latency in seconds.",
        TOK,
        ITL_BUCKETS,
        "sglang:inter_token_latency_seconds",
    ),
    Family(
        "request_time_per_output_token",
        Histogram,
        "Per-request TPOT in seconds.",
        STREAMING,
        ITL_BUCKETS,
        "sglang:request_time_per_output_token_seconds",
    ),
    Family(
        "e2e_request_latency",
        Histogram,
        "Histogram of End-to-end request latency in seconds",
        STREAMING,
        E2E_BUCKETS,
        "sglang:e2e_request_latency_seconds",
    ),
)
# http_request_metrics.py (no model labels).
HTTP = (
    Family(
        "http_requests",
        Counter,
        "Total number of HTTP requests by endpoint and method",
        ("endpoint", "method"),
    ),
    Family(
        "http_responses",
        Counter,
        "Total number of HTTP responses by endpoint and status code",
        ("endpoint", "status_code", "method"),
    ),
    Family(
        "http_requests_active",
        Gauge,
        "Number of currently active HTTP requests",
        ("endpoint", "method"),
    ),
)
FAMILIES = (*SCHEDULER_GAUGES, *SCHEDULER_COUNTERS, *SCHEDULER_OTHERS, *TOKENIZER, *HTTP)
