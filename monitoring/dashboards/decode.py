"""Decode efficiency: CUDA graphs vs eager, batch size vs throughput, step time; each
engine's memory split, KV pool and start-up (SGLang's emit_constants and startup-time
gauges, both roles)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from monitoring.config import Config
from monitoring.dashboards.panels import (
    TOKENS_PER_S,
    Panel,
    Query,
    Section,
    build_dashboard,
    engine_selector,
    engine_variables,
)
from monitoring.queries import RATE_INTERVAL as RATE
from monitoring.queries import rank_rate_sum, rate_sum

UID = "pdstack-decode"


def build(cfg: Config) -> Dashboard:
    engine = engine_selector(cfg)
    # Exporter series about an engine carry its pair and engine labels (not role: that is the
    # exporter's own target label).
    journal = f'{cfg.selectors.exporter}, pair=~"$pair", engine=~"$engine"'
    return build_dashboard(
        UID,
        "Decode efficiency",
        "Whether decode stays inside its CUDA graphs and what each added request costs.",
        [_graphs(engine, journal), _throughput(engine, journal), _memory_and_startup(engine)],
        engine_variables(cfg),
        cfg,
    )


def _graphs(engine: str, journal: str) -> Section:
    return Section(
        "CUDA graphs",
        [
            Panel(
                "Decode passes by mode",
                "Forward passes per second that ran inside a captured "
                "CUDA graph (decode_cuda_graph) or eager (decode_none).",
                "ops",
                [
                    Query(
                        rank_rate_sum(
                            "sglang:cuda_graph_passes_total",
                            f'{engine}, mode=~"decode_.*"',
                            "engine, mode",
                        ),
                        "{{engine}} {{mode}}",
                    )
                ],
                stack=True,
            ),
            Panel(
                "Logged batches by mode",
                "Decode batch lines in the engine journal per second, "
                "graph vs eager (pd-exporter, every --decode-log-interval steps).",
                "ops",
                [
                    Query(
                        rate_sum("pdstack_decode_batches_total", journal, "engine, mode"),
                        "{{engine}} {{mode}}",
                    )
                ],
                stack=True,
            ),
            Panel(
                "Retractions",
                "Running requests sent back to the queue because decode ran out of KV, per "
                "second (counted once, not per TP rank), and how many the last retraction before "
                "the latest logged batch sent back. No data means none since the engine started.",
                "reqps",
                [
                    Query(
                        rank_rate_sum("sglang:num_retracted_requests_total", engine, "engine"),
                        "retracted/s {{engine}}",
                    ),
                    Query(
                        f'max by (engine) (sglang:num_retracted_reqs{{{engine}, role="decode"}})',
                        "last batch {{engine}}",
                    ),
                ],
                kind="bars",
            ),
            Panel(
                "Running requests vs largest graph",
                "Batches above the largest captured graph "
                "run eager: slow, and their temporaries can OOM.",
                "short",
                [
                    Query(
                        f'max by (engine) (sglang:num_running_reqs{{{engine}, role="decode"}})',
                        "running {{engine}}",
                    ),
                    Query(
                        f"max by (engine) (pdstack_decode_cuda_graph_max_batch_size{{{journal}}})",
                        "largest graph {{engine}}",
                    ),
                ],
                width=24,
            ),
        ],
    )


def _throughput(engine: str, journal: str) -> Section:
    return Section(
        "Throughput per request",
        [
            Panel(
                "Tokens per second per running request",
                "Generated tokens per second divided "
                "by running requests: falls as batches grow on a latency-bound decode.",
                TOKENS_PER_S,
                [
                    Query(
                        f"sum by (engine) (rate(sglang:generation_tokens_total{{{engine}, "
                        f'role="decode"}}[{RATE}])) / sum by (engine) (sglang:num_running_reqs{{'
                        f'{engine}, role="decode"}})',
                        "{{engine}}",
                    )
                ],
            ),
            Panel(
                "Generation throughput",
                "Tokens per second the decode scheduler reports with each logged batch: it "
                "holds its last value while the decode logs none (a stalled decode shows "
                "in Decode passes by mode).",
                TOKENS_PER_S,
                [
                    Query(
                        f'sum by (engine) (sglang:gen_throughput{{{engine}, role="decode"}})',
                        "{{engine}}",
                    )
                ],
            ),
            Panel(
                "Decode step time",
                "Mean time of one decode step (running requests / logged "
                "throughput), from the journal.",
                "s",
                [
                    Query(
                        rate_sum("pdstack_decode_step_seconds_sum", journal, "engine")
                        + " / "
                        + rate_sum("pdstack_decode_step_seconds_count", journal, "engine"),
                        "{{engine}}",
                    )
                ],
            ),
            Panel(
                "Running requests per logged batch",
                "Distribution of batch sizes in the decode journal (p50, p95).",
                "short",
                [
                    Query(
                        f"histogram_quantile({q}, sum by (le, engine) "
                        f"(rate(pdstack_decode_running_requests_bucket{{{journal}}}[{RATE}])))",
                        f"p{round(q * 100)} {{{{engine}}}}",
                    )
                    for q in (0.5, 0.95)
                ],
            ),
        ],
    )


def _constant(metric: str, engine: str, legend: str) -> Query:
    """A gauge emit_constants writes once per TP rank, all ranks alike: one rank's value."""
    return Query(f"max by (engine) ({metric}{{{engine}}})", f"{legend} {{{{engine}}}}")


def _memory_and_startup(engine: str) -> Section:
    return Section(
        "Engine memory and start-up",
        [
            Panel(
                "GPU memory by use (per GPU)",
                "What each engine's start-up measured on one GPU: weights, KV cache, "
                "captured CUDA graphs (all phases) and what was left free. Little left free "
                "and eager batches OOM; a smaller KV cache than expected means "
                "--mem-fraction-static or the graphs took the room.",
                "gbytes",  # SGLang's "GB" are GiB (get_available_gpu_memory, memory_pool)
                [
                    _constant("sglang:weight_memory_usage_gb", engine, "weights"),
                    _constant("sglang:kv_cache_memory_usage_gb", engine, "KV cache"),
                    Query(
                        "max by (engine) (sum without (phase) "
                        f"(sglang:graph_memory_usage_gb{{{engine}}}))",
                        "CUDA graphs {{engine}}",
                    ),
                    _constant("sglang:startup_available_gpu_memory_gb", engine, "free"),
                ],
                width=8,
            ),
            Panel(
                "KV pool",
                "KV cache pool size in tokens (max_total_num_tokens) and in pages: "
                "what token_usage divides by.",
                "short",
                [
                    _constant("sglang:max_total_num_tokens", engine, "tokens"),
                    _constant("sglang:num_pages", engine, "pages"),
                ],
                width=8,
            ),
            Panel(
                "Start-up time by phase",
                "How long the engine's last start took: loading weights, allocating the KV "
                "cache, capturing CUDA graphs, up to the scheduler and the HTTP server being "
                "ready. Long start-ups stretch every restart's downtime.",
                "s",
                [
                    Query(
                        f"max by (engine, phase) (sglang:startup_time_seconds{{{engine}}})",
                        "{{phase}} {{engine}}",
                    ),
                    Query(
                        "max by (engine) (sum without (phase) "
                        f"(sglang:startup_cuda_graph_time_seconds{{{engine}}}))",
                        "cuda_graph {{engine}}",
                    ),
                ],
                width=8,
            ),
        ],
    )
