"""PD overview: is the service answering, how fast, how loaded."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from monitoring.dashboards.panels import (
    ENGINE,
    RATE,
    TOKENS_PER_S,
    UP_THRESHOLDS,
    Panel,
    Query,
    Section,
    build_dashboard,
    engine_variables,
    quantiles,
    rate_sum,
)
from monitoring.rules_source import default_thresholds

UID = "pdstack-overview"
# Recorded per pair or group and role (monitoring/rules: PDGroupMembersDown reads the same).
MEMBERS = 'pair_role:pdstack_group_members:max{pair=~"$pair", role=~"$role"}'
MEMBERS_UP = 'pair_role:sglang_members_up:sum{pair=~"$pair", role=~"$role"}'


def build() -> Dashboard:
    health = Section(
        "Health",
        [
            Panel(
                "Engines up",
                "1 when Prometheus scrapes the engine's /metrics; 0 when it is down "
                "or still loading.",
                "none",
                [Query(f"up{{{ENGINE}}}", "{{engine}}")],
                kind="stat",
                width=6,
                height=5,
                thresholds=UP_THRESHOLDS,
            ),
            Panel(
                "Gateway up",
                "1 when the smg gateway's metrics port answers.",
                "none",
                [Query('up{job="smg"}', "{{instance}}")],
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
                [Query('pdstack_pair_canary_success{pair=~"$pair"}', "{{pair}}")],
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
    traffic = Section(
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
                        rate_sum("sglang:num_requests_total", ENGINE, "pair, role"),
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
                        rate_sum("sglang:num_aborted_requests_total", ENGINE, "engine"),
                        "aborted {{engine}}",
                    ),
                    Query(
                        f'sum by (status_code) (rate(smg_http_responses_total{{job="smg", '
                        f'status_code=~"5.."}}[{RATE}]))',
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
                        rate_sum("sglang:prompt_tokens_total", f'{ENGINE}, role="prefill"', "pair"),
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
                            "sglang:generation_tokens_total", f'{ENGINE}, role="decode"', "pair"
                        ),
                        "{{pair}}",
                    )
                ],
            ),
        ],
    )
    latency = Section(
        "Latency",
        [
            Panel(
                "Time to first token",
                "TTFT quantiles on decode (and unified) engines: the decode's TTFT includes "
                "prefill, bootstrap and KV transfer; a PD prefill never records TTFT.",
                "s",
                quantiles(
                    "sglang:time_to_first_token_seconds", f'{ENGINE}, role!="prefill"', "role"
                ),
                width=8,
            ),
            Panel(
                "Inter-token latency",
                "Gap between streamed tokens (decode step time as the "
                "client sees it), quantiles; a PD prefill never records it.",
                "s",
                quantiles(
                    "sglang:inter_token_latency_seconds", f'{ENGINE}, role!="prefill"', "role"
                ),
                width=8,
            ),
            Panel(
                "End-to-end latency",
                "Request latency from arrival to last token, quantiles by role.",
                "s",
                quantiles("sglang:e2e_request_latency_seconds", ENGINE, "role"),
                width=8,
            ),
        ],
    )
    load = Section(
        "Load",
        [
            Panel(
                "Running requests",
                "Requests in the running batch of each engine.",
                "short",
                [Query(f"sum by (engine) (sglang:num_running_reqs{{{ENGINE}}})", "{{engine}}")],
                width=8,
            ),
            Panel(
                "Queued requests",
                "Requests waiting for admission on each engine (PD queues are "
                "on the PD pipeline dashboard).",
                "short",
                [Query(f"sum by (engine) (sglang:num_queue_reqs{{{ENGINE}}})", "{{engine}}")],
                width=8,
            ),
            Panel(
                "KV cache usage",
                "Share of the KV pool in use (evictable prefix cache excluded); "
                "alerts above 95% and when it stays up at idle (leak).",
                "percentunit",
                [Query(f"max by (engine) (sglang:token_usage{{{ENGINE}}})", "{{engine}}")],
                width=8,
                thresholds=((None, "green"), (default_thresholds()["kv_usage_ratio"], "red")),
            ),
        ],
    )
    return build_dashboard(
        UID,
        "PD overview",
        "SGLang prefill/decode serving: health, traffic, latency and load.",
        [health, traffic, latency, load],
        engine_variables(),
    )
