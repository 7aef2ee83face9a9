"""pdstack.records: the recording rules the alerts and dashboards read."""

from __future__ import annotations

from monitoring.alerts.common import MEMBERS, MEMBERS_UP, PENDING, Area, Rule, record
from monitoring.queries import quantile, rate_sum, series

GROUP = "pdstack.records"
# The engines' queue gauges that hold a request not yet finished: waiting, PD bootstrap and
# inflight (prefill), prealloc, transfer and host-receive (decode).
PENDING_QUEUES = (
    "queue",
    "prefill_bootstrap_queue",
    "prefill_inflight_queue",
    "decode_prealloc_queue",
    "decode_transfer_queue",
    "decode_host_receive_queue",
)
# The per-engine counter rates the alerts read, recorded as engine:sglang_<name>:rate<window>.
ENGINE_RATES = (
    ("bootstrap_failed_reqs", "sglang:num_bootstrap_failed_reqs_total", ()),
    ("transfer_failed_reqs", "sglang:num_transfer_failed_reqs_total", ()),
    ("retracted_requests", "sglang:num_retracted_requests_total", ()),
    ("decode_eager_passes", "sglang:cuda_graph_passes_total", ('mode="decode_none"',)),
)
# The decode engines' latency histograms whose p95 per pair the SLO alerts read, recorded as
# pair:sglang_<name>:p95_<window>.
PAIR_P95 = ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds")


def rules(area: Area) -> list[Rule]:
    s, w = area.sel, area.window
    decode = f'{s.engines}, engine_type="decode"'
    return [
        # Everything an engine holds that has not finished. These gauges come from TP rank 0
        # only (log_stats), so the sum is over queues, not ranks.
        record(
            PENDING,
            "sum by (pair, role, engine) ("
            + series("", s.engines, f'__name__=~"sglang:num_({"|".join(PENDING_QUEUES)})_reqs"')
            + ")",
        ),
        *(
            record(f"engine:sglang_{name}:rate{w}", area.per_engine(metric, *matchers))
            for name, metric, matchers in ENGINE_RATES
        ),
        # Members of each role of a pair or group: the topology's count (pd-exporter), and how
        # many of their engines Prometheus scrapes up. A member whose target is missing counts
        # as down, and a role with none up reads 0 rather than nothing.
        record(MEMBERS, f"max by (pair, role) ({series('pdstack_group_members', s.exporter)})"),
        record(
            MEMBERS_UP,
            f"sum by (pair, role) ({series('up', s.engines)}) or on (pair, role) {MEMBERS} * 0",
        ),
        record(
            f"pair:sglang_generation_tokens:rate{w}",
            rate_sum("sglang:generation_tokens_total", decode, "pair", w),
        ),
        *(
            record(
                f"pair:{metric.replace(':', '_')}:p95_{w}",
                quantile(0.95, metric, decode, "pair", w),
            )
            for metric in PAIR_P95
        ),
    ]
