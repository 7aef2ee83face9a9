"""pdstack.kv-cache: an engine's KV pool nearly full, and KV held by an idle engine."""

from __future__ import annotations

from monitoring.alerts.common import ENGINE_OF, PENDING, Area, Rule, value
from monitoring.queries import series

GROUP = "pdstack.kv-cache"


def rules(area: Area) -> list[Rule]:
    s, t = area.sel, area.th
    usage = f"max by (pair, role, engine) ({series('sglang:token_usage', s.engines)})"
    return [
        area.alert(
            "PDKVCacheNearlyFull",
            f"{usage} > {t.kv_usage_ratio}",
            t.kv_usage_for,
            "warning",
            "An engine's KV cache pool is nearly full.",
            f"{ENGINE_OF} uses {value('humanizePercentage')} of its KV pool;"
            " requests will queue or be retracted.",
        ),
        area.alert(
            "PDKVCacheLeak",
            f"{usage} > {t.kv_leak_idle_ratio}"
            f" and on (engine) sum by (engine) ({series('sglang:num_running_reqs', s.engines)})"
            f" == 0 and on (engine) {PENDING} == 0",
            t.kv_leak_for,
            "warning",
            "An idle engine still holds KV cache (leak).",
            f"{ENGINE_OF} has had nothing running or queued for {t.kv_leak_for} but still"
            f" uses {value('humanizePercentage')} of its KV pool.",
        ),
    ]
