"""PD pipeline: where requests wait between prefill and decode, and whether KV moves."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from monitoring.config import Config
from monitoring.dashboards.panels import (
    Panel,
    Query,
    Section,
    build_dashboard,
    engine_selector,
    engine_variables,
    quantiles,
)
from monitoring.queries import rank_rate_sum, rate_sum, series

UID = "pdstack-pipeline"


def _gauge(metric: str, engine: str) -> Query:
    return Query(f"sum by (engine) ({series(metric, engine)})", "{{engine}}")


def build(cfg: Config) -> Dashboard:
    engine = engine_selector(cfg)
    canary = f'{cfg.selectors.exporter}, pair=~"$pair"'
    return build_dashboard(
        UID,
        "PD pipeline",
        "Bootstrap, KV transfer and decode queues between each prefill and "
        "decode; PD failures; per-stage latency; the pair canary.",
        [_queues(engine), _transfer(engine), _failures(engine), _stages(engine, canary)],
        engine_variables(cfg),
        cfg,
    )


def _queues(engine: str) -> Section:
    return Section(
        "Queues",
        [
            Panel(
                "Prefill bootstrap queue",
                "Requests on prefill waiting for their decode to "
                "bootstrap (fetch the route, register KV buffers). Growing with no traffic = the "
                "decode cannot reach the prefill.",
                "short",
                [_gauge("sglang:num_prefill_bootstrap_queue_reqs", engine)],
                width=6,
            ),
            Panel(
                "Prefill inflight queue",
                "Requests prefilled whose KV is being sent to decode.",
                "short",
                [_gauge("sglang:num_prefill_inflight_queue_reqs", engine)],
                width=6,
            ),
            Panel(
                "Decode prealloc queue",
                "Requests on decode waiting for KV memory to be preallocated for their transfer.",
                "short",
                [_gauge("sglang:num_decode_prealloc_queue_reqs", engine)],
                width=6,
            ),
            Panel(
                "Decode transfer queue",
                "Requests on decode waiting for their KV to arrive from prefill.",
                "short",
                [_gauge("sglang:num_decode_transfer_queue_reqs", engine)],
                width=6,
            ),
            Panel(
                "Decode host-receive queue",
                "Requests on decode whose KV is being received into host memory "
                "(hierarchical cache); 0 without it.",
                "short",
                [_gauge("sglang:num_decode_host_receive_queue_reqs", engine)],
            ),
            Panel(
                "Pending prealloc token usage",
                "Share of the decode KV pool reserved for transfers still in flight: "
                "high with a long transfer queue means decode memory waits on KV.",
                "percentunit",
                [
                    Query(
                        "max by (engine) (sglang:pending_prealloc_token_usage"
                        f'{{{engine}, role="decode"}})',
                        "{{engine}}",
                    )
                ],
            ),
        ],
    )


def _transfer(engine: str) -> Section:
    return Section(
        "KV transfer",
        [
            Panel(
                "KV transfer latency",
                "Time to move one request's KV from prefill to decode.",
                "ms",
                quantiles("sglang:kv_transfer_latency_ms", engine, "engine", (0.5, 0.95)),
                width=6,
            ),
            Panel(
                "KV transfer speed",
                "Per-request KV transfer throughput (median and slowest 5%).",
                "GBs",
                quantiles("sglang:kv_transfer_speed_gb_s", engine, "engine", (0.5, 0.05)),
                width=6,
            ),
            Panel(
                "Bootstrap time",
                "Time for a request's bootstrap handshake.",
                "ms",
                quantiles("sglang:kv_transfer_bootstrap_ms", engine, "engine", (0.5, 0.95)),
                width=6,
            ),
            Panel(
                "KV per request",
                "KV cache size transferred per request.",
                "decmbytes",
                quantiles("sglang:kv_transfer_total_mb", engine, "engine", (0.5, 0.95)),
                width=6,
            ),
        ],
    )


def _failures(engine: str) -> Section:
    return Section(
        "Failures",
        [
            Panel(
                "Bootstrap failures",
                "Requests whose PD bootstrap failed, per second. No data "
                "means none failed since the engine started.",
                "reqps",
                [
                    Query(
                        rank_rate_sum("sglang:num_bootstrap_failed_reqs_total", engine, "engine"),
                        "{{engine}}",
                    )
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "KV transfer failures",
                "Requests whose KV transfer failed, per second. No data "
                "means none failed since the engine started.",
                "reqps",
                [
                    Query(
                        rank_rate_sum("sglang:num_transfer_failed_reqs_total", engine, "engine"),
                        "{{engine}}",
                    )
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "Prefill retries and aborts",
                "Prefill retries and aborted requests per second.",
                "reqps",
                [
                    Query(
                        rank_rate_sum("sglang:num_prefill_retries_total", engine, "engine"),
                        "retries {{engine}}",
                    ),
                    Query(
                        rate_sum("sglang:num_aborted_requests_total", engine, "engine"),
                        "aborted {{engine}}",
                    ),
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "Deferred KV release (decode)",
                "Failed transfers whose KV the decode holds until the prefill acks the "
                "abort (held now), and how holds end per second: drained (acked), timeout "
                "(no ack within SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT) "
                "or error. Timeouts mean the prefill is gone or hangs (PDDecodeKVReleaseTimeouts).",
                "short",
                [
                    Query(
                        "max by (engine) (sglang:num_decode_deferred_kv_release_reqs"
                        f'{{{engine}, role="decode"}})',
                        "held {{engine}}",
                    ),
                    Query(
                        rank_rate_sum(
                            "sglang:decode_deferred_kv_release_total", engine, "engine, outcome"
                        ),
                        "{{outcome}} {{engine}}",
                    ),
                ],
                width=24,
            ),
        ],
    )


def _stages(engine: str, canary: str) -> Section:
    return Section(
        "Stages and canary",
        [
            Panel(
                "Per-stage latency (p95)",
                "Where a request's time goes: prefill bootstrap, KV "
                "send, decode prepare/bootstrap/waiting/transferred.",
                "s",
                quantiles("sglang:per_stage_req_latency_seconds", engine, "stage", (0.95,)),
            ),
            Panel(
                "Queue time",
                "Time requests wait in each engine's queue before running.",
                "s",
                quantiles("sglang:queue_time_seconds", engine, "role", (0.5, 0.95)),
            ),
            Panel(
                "Pair canary latency",
                "Duration of the exporter's one-token generate through each pair.",
                "s",
                [Query(f"pdstack_pair_canary_duration_seconds{{{canary}}}", "{{pair}}")],
            ),
            Panel(
                "Pair canary failures",
                "Failed canary generates per second, per pair.",
                "reqps",
                [
                    Query(
                        rate_sum("pdstack_pair_canary_failures_total", canary, "pair"),
                        "{{pair}}",
                    )
                ],
                kind="bars",
            ),
        ],
    )
