"""A rollout wave's gate: the wave's groups (new release) against the groups still on the
release before (old), over the same soak window, from Prometheus.

Per new group, each against the old groups taken together (their buckets and counters
summed, as one group of their size):
- failed-request percentage, the strict rule as the engines count it: requests aborted
  (sglang:num_aborted_requests), KV transfers and bootstraps that failed
  (sglang:num_transfer_failed_reqs, sglang:num_bootstrap_failed_reqs, one TP rank's count),
  and HTTP answers other than 2xx (sglang:http_responses), over the requests the group's
  decodes finished (sglang:num_requests, engine_type decode); at most
  `max_error_ratio_points` above the old groups';
- TTFT p90 and ITL p90 (histogram_quantile over sglang:time_to_first_token_seconds and
  sglang:inter_token_latency_seconds of the decodes, by the `pair` label Prometheus gives every
  engine: the group's id), at most `max_*_p90_ratio` times the old groups';
- KV transfer and bootstrap failures, at most `max_kv_transfer_failures` per new group.

A side that finished fewer than `min_requests` requests in the window, or a figure Prometheus
has no value for, fails the gate (closed): a gate that cannot see is not a pass. A ratio at
exactly its limit passes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import requests
from pydantic import BaseModel

from pdctl.errors import PdctlError
from pdctl.spec.profile import Rollout

JOB = 'job="sglang"'
DECODE = 'engine_type="decode"'
QUANTILE = 0.9
TIMEOUT_S = 30.0
OLD = "old"  # the key of the old groups' figures

# An instant query: its series by the `pair` label ("" on an aggregate without it).
Query = Callable[[str], dict[str, float]]


class Figures(BaseModel):
    """One side's figures over the window; None: Prometheus had no value."""

    requests: float | None = None  # finished by the decodes
    failed: float | None = None
    kv_failures: float | None = None
    ttft_p90_s: float | None = None
    itl_p90_s: float | None = None

    @property
    def error_pct(self) -> float | None:
        if self.requests is None or self.failed is None or self.requests <= 0:
            return None
        return min(100.0, 100.0 * self.failed / self.requests)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    failures: list[str]  # one phrase per failed check: the gate, groups, figures new vs old

    def message(self) -> str:
        return "; ".join(self.failures)


def _pairs(groups: list[str]) -> str:
    """A `pair` matcher for exactly these group ids (PromQL regexes are anchored); a
    backslash of the regex is written twice in PromQL's double-quoted string."""
    alternation = "|".join(re.escape(g) for g in groups).replace("\\", "\\\\")
    return f'pair=~"{alternation}"'


def _by(per_group: bool) -> str:
    return "sum by (pair)" if per_group else "sum"


def _increase(metric: str, matchers: str, per_group: bool, window: str, ranks: bool) -> str:
    inner = f"increase({metric}{{{matchers}}}[{window}])"
    if ranks:  # every TP rank counts the same event: one rank's count (docs/monitoring.md)
        inner = f"max without (tp_rank) ({inner})"
    return f"{_by(per_group)} ({inner})"


def _p90(histogram: str, matchers: str, per_group: bool, window: str) -> str:
    by = "le, pair" if per_group else "le"
    return (
        f"histogram_quantile({QUANTILE}, sum by ({by}) "
        f"(rate({histogram}_bucket{{{matchers}, {DECODE}}}[{window}])))"
    )


def queries(groups: list[str], window_s: float, per_group: bool) -> dict[str, list[str]]:
    """Each figure's expressions (a figure of several is their sum) over `groups`."""
    m, w = f"{JOB}, {_pairs(groups)}", f"{round(window_s)}s"
    kv = [
        _increase("sglang:num_transfer_failed_reqs_total", m, per_group, w, ranks=True),
        _increase("sglang:num_bootstrap_failed_reqs_total", m, per_group, w, ranks=True),
    ]
    return {
        "requests": [_increase("sglang:num_requests_total", f"{m}, {DECODE}", per_group, w, False)],
        "failed": [
            *kv,
            _increase("sglang:num_aborted_requests_total", m, per_group, w, ranks=False),
            _increase(
                "sglang:http_responses_total", f'{m}, status_code!~"2.."', per_group, w, False
            ),
        ],
        "kv_failures": kv,
        "ttft_p90_s": [_p90("sglang:time_to_first_token_seconds", m, per_group, w)],
        "itl_p90_s": [_p90("sglang:inter_token_latency_seconds", m, per_group, w)],
    }


# Counters a group without such events has no series of (a sum over nothing is empty): 0.
_ZERO_WHEN_ABSENT = {"failed", "kv_failures"}


def measure(
    query: Query, groups: list[str], window_s: float, per_group: bool
) -> dict[str, Figures]:
    """Per group (`per_group`), or all of `groups` as one (key OLD)."""
    keys = groups if per_group else [OLD]
    got: dict[str, dict[str, float | None]] = {k: {} for k in keys}
    for figure, exprs in queries(groups, window_s, per_group).items():
        answers = [query(e) for e in exprs]
        for k in keys:
            label = k if per_group else ""
            values = [a.get(label) for a in answers]
            values = [None if v is not None and math.isnan(v) else v for v in values]
            if figure in _ZERO_WHEN_ABSENT:
                values = [0.0 if v is None else v for v in values]
            got[k][figure] = None if None in values else sum(v for v in values if v is not None)
    return {k: Figures.model_validate(v) for k, v in got.items()}


def _ms(s: float | None) -> str:
    return "no data" if s is None else f"{s * 1000:.1f} ms"


def _pct(p: float | None) -> str:
    return "no data" if p is None else f"{p:.2f}%"


def _ratio_check(new: float | None, old: float | None, limit: float) -> tuple[bool, str]:
    """(passes, figures) of a latency ratio; a side without a value fails."""
    figures = f"{_ms(new)} vs old {_ms(old)}"
    if new is None or old is None:
        return False, figures
    if old <= 0:
        return new <= 0, figures
    return new / old <= limit, f"{figures} ({new / old:.2f}x, limit {limit:g}x)"


def _group_failures(gid: str, new: Figures, old: Figures, t: Rollout) -> list[str]:
    """The checks `gid` fails, each as `gate: group figures`."""
    out = []
    for side, f in (("the old groups", old), (gid, new)):
        if f.requests is None or f.requests < t.min_requests:
            done = "none" if f.requests is None else f"{f.requests:.0f}"
            out.append(
                f"data: {side} finished {done} requests in the window, fewer than "
                f"min_requests {t.min_requests}: the gate cannot judge {gid}"
            )
    if out:
        return out
    new_pct, old_pct = new.error_pct, old.error_pct
    assert new_pct is not None and old_pct is not None  # requests > 0 and failed counted
    if new_pct - old_pct > t.max_error_ratio_points:
        out.append(
            f"error ratio: {gid} {_pct(new_pct)} vs old {_pct(old_pct)} "
            f"(+{new_pct - old_pct:.2f} points, limit {t.max_error_ratio_points:g})"
        )
    if (new.kv_failures or 0) > t.max_kv_transfer_failures:
        out.append(
            f"kv transfer failures: {gid} {new.kv_failures:.0f} vs old {old.kv_failures or 0:.0f}"
            f" (limit {t.max_kv_transfer_failures})"
        )
    for name, n, o, limit in (
        ("ttft p90", new.ttft_p90_s, old.ttft_p90_s, t.max_ttft_p90_ratio),
        ("itl p90", new.itl_p90_s, old.itl_p90_s, t.max_itl_p90_ratio),
    ):
        ok, figures = _ratio_check(n, o, limit)
        if not ok:
            out.append(f"{name}: {gid} {figures}")
    return out


def judge(new: dict[str, Figures], old: Figures, t: Rollout) -> Verdict:
    """Every new group against the old groups; the failures name gate, group and figures."""
    failures = [f for gid, fig in new.items() for f in _group_failures(gid, fig, old, t)]
    return Verdict(not failures, failures)


def prometheus(url: str, at: float | None = None) -> Query:
    """Instant queries at `url` (Prometheus's HTTP API), at time `at` (default: now)."""

    def query(expr: str) -> dict[str, float]:
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = at
        try:
            r = requests.get(f"{url.rstrip('/')}/api/v1/query", params=params, timeout=TIMEOUT_S)
            body = r.json()
        except (requests.RequestException, ValueError) as e:
            raise PdctlError(f"Prometheus at {url} does not answer: {e}") from None
        if body.get("status") != "success":
            raise PdctlError(f"Prometheus at {url} refused a query: {body.get('error', r.text)}")
        return {s["metric"].get("pair", ""): float(s["value"][1]) for s in body["data"]["result"]}

    return query
