"""pdstack.pd-path: bootstrap and KV-transfer failures between prefill and decode, KV held
for failed transfers, and requests stuck on an engine."""

from __future__ import annotations

from monitoring.alerts.common import ENGINE_OF, PENDING, Area, Rule, value
from monitoring.queries import rate_sum

GROUP = "pdstack.pd-path"


def rules(area: Area) -> list[Rule]:
    s, t = area.sel, area.th
    hang = t.hang_window
    # decode.py resolve_deferred_releases: a failed transfer's KV stays held until every
    # prefill rank acks the abort; "timeout" (no ack: the prefill died or hangs) or
    # "error" (the release raised) mean held or possibly leaked decode KV.
    released_late = area.per_engine(
        "sglang:decode_deferred_kv_release_total", 'outcome!="drained"', fn="increase"
    )
    return [
        area.alert(
            "PDBootstrapFailures",
            f"{area.per_engine('sglang:num_bootstrap_failed_reqs_total', fn='increase')}"
            f" > {t.pd_failures_per_5m}",
            t.pd_failures_for,
            "warning",
            "PD bootstrap failures are rising.",
            f"{ENGINE_OF} failed {value('humanize')} bootstraps in {area.over}.",
        ),
        area.alert(
            "PDTransferFailures",
            f"{area.per_engine('sglang:num_transfer_failed_reqs_total', fn='increase')}"
            f" > {t.pd_failures_per_5m}",
            t.pd_failures_for,
            "warning",
            "KV-cache transfers between prefill and decode are failing.",
            f"{ENGINE_OF} failed {value('humanize')} KV transfers in {area.over}.",
        ),
        area.alert(
            "PDDecodeKVReleaseTimeouts",
            f"{released_late} > {t.pd_failures_per_5m}",
            t.pd_failures_for,
            "warning",
            "Decode holds failed transfers' KV until a timeout: the prefill does not ack.",
            f"{ENGINE_OF} released {value('humanize')} failed transfers' KV by timeout or"
            f" error in {area.over} instead of on the prefill's abort ack.",
        ),
        # Queued work and not one request finished: a hang (often a stale bootstrap after a
        # one-sided restart), not load. A missing counter counts as no completions.
        area.alert(
            "PDRequestsStuck",
            f"{PENDING} > 0 and on (engine) ("
            f"{rate_sum('sglang:num_requests_total', s.engines, 'engine', hang, 'increase')}"
            f" or on (engine) {PENDING} * 0) == 0",
            t.hang_for,
            "critical",
            "Requests are queued on an engine but none completes.",
            f"{ENGINE_OF} holds {value()} pending requests and completed none in {hang}.",
        ),
    ]
