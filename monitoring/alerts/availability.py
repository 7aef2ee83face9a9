"""pdstack.availability: engines, gateway and pd-exporter down; the gateway's view of its
workers; pairs and groups that fail requests or serve short of members."""

from __future__ import annotations

from monitoring.alerts.common import ENGINE_OF, MEMBERS, MEMBERS_UP, Area, Rule, label, value
from monitoring.queries import rate_sum, series

GROUP = "pdstack.availability"
# Requests the gateway refused: every worker overloaded, or no decode admission slot in time.
SHED_COUNTERS = ("smg_worker_overload_shed_total", "smg_pd_admission_sheds_total")


def rules(area: Area) -> list[Rule]:
    return [*_down(area), *_gateway(area), *_groups(area), *_exporter(area)]


def _down(area: Area) -> list[Rule]:
    """The engines and the gateway not answering their metrics endpoints."""
    s, down = area.sel, area.th.down_for
    return [
        area.alert(
            "PDEngineDown",
            f"{series('up', s.engines)} == 0",
            down,
            "critical",
            "An SGLang engine is not answering its metrics endpoint.",
            f"{ENGINE_OF} ({label('instance')}) has been down for more than {down}.",
        ),
        area.alert(
            "PDGatewayDown",
            f"{series('up', s.gateway)} == 0",
            down,
            "critical",
            "The PD gateway is not answering its metrics endpoint.",
            f"Gateway {label('instance')} has been down for more than {down};"
            " no request reaches any pair.",
        ),
    ]


def _gateway(area: Area) -> list[Rule]:
    """The gateway's workers (unhealthy, circuit open, stalled), its errors and shedding."""
    s, down = area.sel, area.th.down_for
    return [
        # The gateway routes nothing to a worker it marks unhealthy; with its only prefill or
        # decode out, the whole service is down even though the gateway itself answers.
        area.alert(
            "PDGatewayWorkerUnhealthy",
            f"max by (instance, worker) ({series('smg_worker_health', s.gateway)}) == 0",
            down,
            "warning",
            "The gateway marks a worker unhealthy and routes no traffic to it.",
            f"Gateway {label('instance')} has marked worker {label('worker')} unhealthy for"
            f" more than {down}.",
        ),
        area.alert(
            "PDGatewayCircuitOpen",
            f"max by (instance, worker) ({series('smg_worker_cb_state', s.gateway)}) == 1",
            down,
            "warning",
            "The gateway's circuit breaker for a worker is open.",
            f"Gateway {label('instance')} has kept the circuit breaker of worker"
            f" {label('worker')} open for more than {down}: its requests failed.",
        ),
        *_gateway_refusals(area),
        area.alert(
            "PDGatewayWorkerStalled",
            f"max by (instance, worker, reason) ({series('smg_worker_stalled', s.gateway)}) == 1",
            down,
            "warning",
            "The gateway skips a worker it considers stalled.",
            f"Gateway {label('instance')} has skipped worker {label('worker')} for more"
            f" than {down} (liveness veto: {label('reason')}).",
        ),
    ]


def _gateway_refusals(area: Area) -> list[Rule]:
    """Requests the gateway failed or shed."""
    s, t, w = area.sel, area.th, area.window
    return [
        # Requests the gateway answered with an error (any cause: no worker, upstream error,
        # timeout), as a share of all requests it routed.
        area.alert(
            "PDGatewayErrors",
            f"{rate_sum('smg_router_request_errors_total', s.gateway, 'instance', w)}"
            f" / {rate_sum('smg_router_requests_total', s.gateway, 'instance', w)}"
            f" > {t.gateway_error_ratio}",
            t.gateway_errors_for,
            "warning",
            "The gateway fails a share of its requests.",
            f"Gateway {label('instance')} failed {value('humanizePercentage')} of its"
            f" requests over {area.over} (threshold {t.gateway_error_ratio}).",
        ),
        # Requests refused because every worker is overloaded or no decode admission slot
        # freed in time: the service is over capacity, not broken.
        area.alert(
            "PDGatewayLoadShedding",
            rate_sum(
                "",
                f'{s.gateway}, __name__=~"{"|".join(SHED_COUNTERS)}"',
                "instance",
                w,
                "increase",
            )
            + " > 0",
            t.shed_for,
            "warning",
            "The gateway sheds requests (over capacity).",
            f"Gateway {label('instance')} shed {value('humanize')} requests in {area.over}:"
            " every worker was overloaded or no decode admission slot freed in time.",
        ),
    ]


def _groups(area: Area) -> list[Rule]:
    """Pairs and groups that fail real requests or serve short of members."""
    s, t, down = area.sel, area.th, area.th.down_for
    return [
        # The canary is a real generate through the PD path; engines' own /health passes
        # even when prefill and decode cannot talk to each other.
        area.alert(
            "PDPairDegraded",
            f"min by (pair) ({series('pdstack_pair_canary_success', s.exporter)}) == 0"
            f" and on (pair) min by (pair) ({series('up', s.engines)}) == 1",
            t.canary_for,
            "critical",
            "A PD pair fails real requests while both engines report healthy.",
            f"The canary generate through pair {label('pair')} has failed for more than"
            f" {t.canary_for} although its prefill and decode are up: the PD path"
            " (bootstrap or KV transfer) is broken.",
        ),
        # A group still serving (an engine of each role up) with fewer members up than the
        # topology gives it: it runs short of capacity. A pair cannot serve short (one member
        # a role); an engine down is PDEngineDown's, a whole role down the canary's too.
        area.alert(
            "PDGroupMembersDown",
            f"{MEMBERS} - on (pair, role) {MEMBERS_UP} > 0"
            f" and on (pair) min by (pair) ({MEMBERS_UP}) > 0",
            down,
            "warning",
            "A group serves with fewer members than it has.",
            f"{value()} {label('role')} member(s) of group {label('pair')} have been down"
            f" or unscraped for more than {down}; the group serves on the others with"
            " less capacity.",
        ),
    ]


def _exporter(area: Area) -> list[Rule]:
    """pd-exporter down, or one of its collectors failing."""
    s, down = area.sel, area.th.down_for
    return [
        area.alert(
            "PDExporterDown",
            f"{series('up', s.exporter)} == 0",
            down,
            "warning",
            "pd-exporter is not answering; GPU, canary and journal metrics are missing.",
            f"pd-exporter on {label('instance')} has been down for more than {down}.",
        ),
        area.alert(
            "PDExporterCollectorFailing",
            f"{series('pdstack_scrape_success', s.exporter)} == 0",
            down,
            "warning",
            "A pd-exporter collector fails on every scrape.",
            f"Collector {label('collector')} of pd-exporter on {label('instance')} has"
            f" failed for more than {down}; its metrics are missing or stale.",
        ),
    ]
