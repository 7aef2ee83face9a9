"""PD overview: is the service answering, how fast, how loaded."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from monitoring.config import Config
from monitoring.dashboards.panels import (
    TOKENS_PER_S,
    UP_THRESHOLDS,
    Panel,
    Query,
    Section,
    build_dashboard,
    engine_selector,
    engine_variables,
    quantiles,
)
from monitoring.queries import rate_sum, series

UID = "pdstack-overview"
# Recorded per pair or group and role (monitoring/rules: PDGroupMembersDown reads the same).
MEMBERS = 'pair_role:pdstack_group_members:max{pair=~"$pair", role=~"$role"}'
MEMBERS_UP = 'pair_role:sglang_members_up:sum{pair=~"$pair", role=~"$role"}'


def build(cfg: Config) -> Dashboard:
    engine = engine_selector(cfg)
    canary = f'{cfg.selectors.exporter}, pair=~"$pair"'
    return build_dashboard(
        UID,
        "PD overview",
        "SGLang prefill/decode serving: health, traffic, latency and load.",
        [_health(cfg, engine, canary), _traffic(cfg, engine), _latency(engine), _load(cfg, engine)],
        engine_variables(cfg),
        cfg,
    )


def _health(cfg: Config, engine: str, canary: str) -> Section:
    return Section(
        "Health",
        [
            Panel(
                "Engines up",
                "1 when Prometheus scrapes the engine's /metrics; 0 when it is down "
                "or still loading.",
                "none",
                [Query(f"up{{{engine}}}", "{{engine}}")],
                kind="stat",
                width=6,
                height=5,
                thresholds=UP_THRESHOLDS,
            ),
            Panel(
                "Gateway up",
                "1 when the smg gateway's metrics port answers.",
                "none",
                [Query(series("up", cfg.selectors.gateway), "{{instance}}")],
                kind="stat",
                width=6,
                height=5,
                thresholds=UP_THRESHOLDS,
            ),
            Panel(
                "Pair canary",
                "1 when the exporter's one-token generate through the pair's PD path (a "
                "group's: every prefill and every decode) succeeded; 0 means it is degraded "
                "even if its engines look up.",
                "none",
                [Query(f"pdstack_pair_canary_success{{{canary}}}", "{{pair}}")],
                kind="stat",
                width=6,
                height=5,
                thresholds=UP_THRESHOLDS,
            ),
            Panel(
                "Members down",
                "Per pair or group and role: members the topology gives it (pd-exporter) "
                "less the engines Prometheus scrapes up, a missing target counted as down. "
                "A group serving short of members fires PDGroupMembersDown.",
                "none",
                [Query(f"{MEMBERS} - on (pair, role) {MEMBERS_UP}", "{{pair}} {{role}}")],
                kind="stat",
                width=6,
                height=5,
                thresholds=((None, "green"), (1, "red")),
            ),
        ],
    )


def _traffic(cfg: Config, engine: str) -> Section:
    return Section(
        "Traffic",
        [
            Panel(
                "Requests finished",
                "Requests that ended per second by each role, aborted ones included (the "
                "Errors panel splits those out); the gateway sends every request to a "
                "prefill and a decode.",
                "reqps",
                [
                    Query(
                        rate_sum("sglang:num_requests_total", engine, "pair, role"),
                        "{{pair}} {{role}}",
                    )
                ],
            ),
            Panel(
                "Errors",
                "Aborted requests per engine and the gateway's 5xx responses per second.",
                "reqps",
                [
                    Query(
                        rate_sum("sglang:num_aborted_requests_total", engine, "engine"),
                        "aborted {{engine}}",
                    ),
                    Query(
                        rate_sum(
                            "smg_http_responses_total",
                            f'{cfg.selectors.gateway}, status_code=~"5.."',
                            "status_code",
                        ),
                        "gateway {{status_code}}",
                    ),
                ],
            ),
            Panel(
                "Input tokens",
                "Prompt tokens per second processed by the prefill engines.",
                TOKENS_PER_S,
                [
                    Query(
                        rate_sum("sglang:prompt_tokens_total", f'{engine}, role="prefill"', "pair"),
                        "{{pair}}",
                    )
                ],
            ),
            Panel(
                "Output tokens",
                "Generated tokens per second by the decode engines.",
                TOKENS_PER_S,
                [
                    Query(
                        rate_sum(
                            "sglang:generation_tokens_total", f'{engine}, role="decode"', "pair"
                        ),
                        "{{pair}}",
                    )
                ],
            ),
        ],
    )


def _latency(engine: str) -> Section:
    return Section(
        "Latency",
        [
            Panel(
                "Time to first token",
                "TTFT quantiles on decode (and unified) engines: the decode's TTFT includes "
                "prefill, bootstrap and KV transfer; a PD prefill never records TTFT.",
                "s",
                quantiles(
                    "sglang:time_to_first_token_seconds", f'{engine}, role!="prefill"', "role"
                ),
                width=8,
            ),
            Panel(
                "Inter-token latency",
                "Gap between streamed tokens (decode step time as the "
                "client sees it), quantiles; a PD prefill never records it.",
                "s",
                quantiles(
                    "sglang:inter_token_latency_seconds", f'{engine}, role!="prefill"', "role"
                ),
                width=8,
            ),
            Panel(
                "End-to-end latency",
                "Request latency from arrival to last token, quantiles by role.",
                "s",
                quantiles("sglang:e2e_request_latency_seconds", engine, "role"),
                width=8,
            ),
        ],
    )


def _load(cfg: Config, engine: str) -> Section:
    return Section(
        "Load",
        [
            Panel(
                "Running requests",
                "Requests in the running batch of each engine.",
                "short",
                [Query(f"sum by (engine) (sglang:num_running_reqs{{{engine}}})", "{{engine}}")],
                width=8,
            ),
            Panel(
                "Queued requests",
                "Requests waiting for admission on each engine (PD queues are "
                "on the PD pipeline dashboard).",
                "short",
                [Query(f"sum by (engine) (sglang:num_queue_reqs{{{engine}}})", "{{engine}}")],
                width=8,
            ),
            Panel(
                "KV cache usage",
                "Share of the KV pool in use (evictable prefix cache excluded); "
                "alerts above 95% and when it stays up at idle (leak).",
                "percentunit",
                [Query(f"max by (engine) (sglang:token_usage{{{engine}}})", "{{engine}}")],
                width=8,
                thresholds=((None, "green"), (cfg.thresholds.kv_usage_ratio, "red")),
            ),
        ],
    )
