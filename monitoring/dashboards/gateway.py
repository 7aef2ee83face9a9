"""Gateway: the smg router in front of the pairs (names as smg 1.13.0 emits them)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable

from monitoring.config import Config
from monitoring.dashboards.panels import (
    Panel,
    Query,
    Section,
    build_dashboard,
    quantiles,
    query_variable,
)
from monitoring.queries import RATE_INTERVAL as RATE
from monitoring.queries import rate_sum, series

UID = "pdstack-gateway"


def variables(cfg: Config) -> list[QueryVariable]:
    return [
        query_variable(
            "instance", "Gateway", f"label_values({series('up', cfg.selectors.gateway)}, instance)"
        )
    ]


def build(cfg: Config) -> Dashboard:
    gw = f'{cfg.selectors.gateway}, instance=~"$instance"'
    return build_dashboard(
        UID,
        "Gateway",
        "The smg gateway: requests, errors, retries, latency, worker health and circuit breakers.",
        [_traffic(gw), _errors(gw), _latency(gw), _workers(gw)],
        variables(cfg),
        cfg,
    )


def _traffic(gw: str) -> Section:
    return Section(
        "Requests",
        [
            Panel(
                "Routed requests",
                "Requests routed to the PD backends per second, by endpoint.",
                "reqps",
                [
                    Query(
                        rate_sum("smg_router_requests_total", gw, "endpoint"),
                        "{{endpoint}}",
                    )
                ],
            ),
            Panel(
                "Responses by status",
                "HTTP responses per second by status code.",
                "reqps",
                [
                    Query(
                        rate_sum("smg_http_responses_total", gw, "status_code"),
                        "{{status_code}}",
                    )
                ],
                stack=True,
            ),
            Panel(
                "Error ratio",
                "Share of responses that are 5xx. A streamed request that fails after its "
                "200 (a degraded pair fails every KV transfer) counts as a success here: read "
                "the pair canary and KV transfer failures (PD pipeline) for those.",
                "percentunit",
                [
                    Query(
                        f'(sum(rate(smg_http_responses_total{{{gw}, status_code=~"5.."}}[{RATE}])) '
                        f"or vector(0)) / sum(rate(smg_http_responses_total{{{gw}}}[{RATE}]))",
                        "5xx",
                    )
                ],
            ),
            Panel(
                "Retries",
                "Retries of failed upstream calls per second by worker type, and "
                "requests whose retries ran out.",
                "reqps",
                [
                    Query(
                        rate_sum("smg_worker_retries_total", gw, "worker_type"),
                        "retries {{worker_type}}",
                    ),
                    Query(
                        rate_sum("smg_worker_retries_exhausted_total", gw, "worker_type"),
                        "exhausted {{worker_type}}",
                    ),
                ],
            ),
        ],
    )


def _errors(gw: str) -> Section:
    return Section(
        "Errors and load shedding",
        [
            Panel(
                "Gateway errors by type",
                "Requests the gateway failed per second, by error type. No data means none "
                "since the gateway started.",
                "reqps",
                [
                    Query(
                        rate_sum("smg_router_request_errors_total", gw, "error_type"),
                        "{{error_type}}",
                    )
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "Worker errors",
                "Errors talking to workers per second, by worker type and error type.",
                "reqps",
                [
                    Query(
                        rate_sum("smg_worker_errors_total", gw, "worker_type, error_type"),
                        "{{worker_type}} {{error_type}}",
                    )
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "Load shed",
                "Requests refused per second: every worker overloaded (by stage) or no "
                "decode admission slot freed in time (PD admission).",
                "reqps",
                [
                    Query(
                        rate_sum("smg_worker_overload_shed_total", gw, "stage"),
                        "overloaded {{stage}}",
                    ),
                    Query(
                        f"sum(rate(smg_pd_admission_sheds_total{{{gw}}}[{RATE}]))",
                        "PD admission",
                    ),
                ],
                width=8,
                kind="bars",
            ),
            Panel(
                "Stalled workers",
                "Liveness veto per worker (1: routing skips it), with the reason.",
                "none",
                [Query(f"smg_worker_stalled{{{gw}}}", "{{worker}} {{reason}}")],
                width=12,
            ),
            Panel(
                "PD prefill duration",
                "Prefill leg of PD requests as the gateway measures it (dispatch to the "
                "prefill's answer), quantiles.",
                "s",
                quantiles("smg_pd_prefill_duration_seconds", gw, "instance", (0.5, 0.95)),
                width=12,
            ),
        ],
    )


def _latency(gw: str) -> Section:
    return Section(
        "Latency",
        [
            Panel(
                "Request duration",
                "Gateway request duration quantiles.",
                "s",
                quantiles("smg_router_request_duration_seconds", gw, "endpoint"),
            ),
            Panel(
                "PD time to first token",
                "Prefill dispatch to the first decode token, measured by the gateway.",
                "s",
                quantiles("smg_pd_ttft_seconds", gw, "model"),
            ),
        ],
    )


def _workers(gw: str) -> Section:
    return Section(
        "Workers",
        [
            Panel(
                "Worker health",
                "Gateway health-check verdict per worker (1 healthy).",
                "none",
                [Query(f"smg_worker_health{{{gw}}}", "{{worker}}")],
                width=8,
            ),
            Panel(
                "Circuit breakers",
                "Breaker state per worker: 0 closed, 1 open (no traffic), 2 half-open.",
                "none",
                [Query(f"smg_worker_cb_state{{{gw}}}", "{{worker}}")],
                width=8,
            ),
            Panel(
                "Active requests per worker",
                "Requests in flight on each worker.",
                "short",
                [Query(f"smg_worker_requests_active{{{gw}}}", "{{worker}}")],
                width=8,
            ),
            Panel(
                "Failed health checks",
                "Failed gateway health checks per second by worker type.",
                "ops",
                [
                    Query(
                        f"sum by (worker_type) (rate(smg_worker_health_checks_total{{{gw}, "
                        f'result!="success"}}[{RATE}]))',
                        "{{worker_type}}",
                    )
                ],
            ),
            Panel(
                "Breaker transitions",
                "Circuit-breaker state changes per second.",
                "ops",
                [
                    Query(
                        rate_sum("smg_worker_cb_transitions_total", gw, "worker"),
                        "{{worker}}",
                    )
                ],
            ),
        ],
    )
