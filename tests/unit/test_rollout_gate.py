"""The rollout gate's arithmetic (pdctl.ops.gate): new groups against the old ones, limits
inclusive, missing data failing closed, and the PromQL it asks Prometheus."""

from __future__ import annotations

import math
import re

import pytest

from pdctl.ops import gate
from pdctl.ops.gate import Figures
from pdctl.spec.profile import Rollout

LIMITS = Rollout(
    max_itl_p90_ratio=1.2,
    max_ttft_p90_ratio=1.5,
    max_error_ratio_points=0.5,
    max_kv_transfer_failures=0,
    min_requests=20,
)
OLD = Figures(requests=1000, failed=2, kv_failures=0, ttft_p90_s=0.200, itl_p90_s=0.010)


def _new(**change: float | None) -> Figures:
    return OLD.model_copy(update=change)


def test_a_wave_like_the_old_groups_passes() -> None:
    verdict = gate.judge({"a/pd0": _new(), "a/pd1": _new(itl_p90_s=0.011)}, OLD, LIMITS)
    assert verdict.ok and verdict.failures == []


def test_slower_itl_fails_naming_gate_group_and_figures() -> None:
    verdict = gate.judge({"a/pd0": _new(), "a/pd1": _new(itl_p90_s=0.015)}, OLD, LIMITS)
    assert not verdict.ok
    assert verdict.failures == [
        "itl p90: a/pd1 15.0 ms vs old 10.0 ms (1.50x, limit 1.2x)",
    ]


def test_a_ratio_at_its_limit_passes_and_just_above_fails() -> None:
    at = gate.judge({"g": _new(itl_p90_s=0.012, ttft_p90_s=0.300)}, OLD, LIMITS)
    assert at.ok
    above = gate.judge({"g": _new(itl_p90_s=0.01201)}, OLD, LIMITS)
    assert [f.split(":")[0] for f in above.failures] == ["itl p90"]


def test_error_points_are_measured_against_the_old_groups_percentage() -> None:
    # old 0.20%; new 0.70% is +0.50 points (the limit, passes); 0.80% is +0.60 (fails)
    assert gate.judge({"g": _new(failed=7)}, OLD, LIMITS).ok
    failed = gate.judge({"g": _new(failed=8)}, OLD, LIMITS).failures
    assert failed == ["error ratio: g 0.80% vs old 0.20% (+0.60 points, limit 0.5)"]


def test_kv_transfer_failures_above_the_limit_fail() -> None:
    failed = gate.judge({"g": _new(kv_failures=3)}, OLD, LIMITS).failures
    assert failed == ["kv transfer failures: g 3 vs old 0 (limit 0)"]


@pytest.mark.parametrize(
    ("new", "old", "fails"),
    [
        (_new(requests=None), OLD, "data: g finished none requests"),
        (_new(requests=19), OLD, "data: g finished 19 requests"),
        (_new(), OLD.model_copy(update={"requests": 5}), "data: the old groups finished 5"),
        (_new(itl_p90_s=None), OLD, "itl p90: g no data vs old 10.0 ms"),
        (_new(), OLD.model_copy(update={"ttft_p90_s": None}), "ttft p90: g 200.0 ms vs old no"),
    ],
)
def test_missing_data_fails_closed(new: Figures, old: Figures, fails: str) -> None:
    verdict = gate.judge({"g": new}, old, LIMITS)
    assert not verdict.ok
    assert any(f.startswith(fails) for f in verdict.failures), verdict.failures


def test_an_old_latency_of_zero_passes_only_a_new_one_of_zero() -> None:
    zero = OLD.model_copy(update={"itl_p90_s": 0.0})
    assert gate.judge({"g": _new(itl_p90_s=0.0)}, zero, LIMITS).ok
    assert not gate.judge({"g": _new(itl_p90_s=0.001)}, zero, LIMITS).ok


def _prometheus(series: dict[str, dict[str, float]]) -> gate.Query:
    """Answers each expression by the metric it reads: `series[metric]` by pair label (an
    aggregate without `by (pair)` gets the sum under "")."""

    def query(expr: str) -> dict[str, float]:
        metric = re.search(r"(sglang:[a-z_]+?)(_bucket)?\{", expr)
        assert metric is not None
        got = series.get(metric[1], {})
        if "by (pair)" in expr or "le, pair" in expr:
            return dict(got)
        return {"": sum(got.values())} if got else {}

    return query


def test_measure_sums_failure_families_and_treats_absent_counters_as_zero() -> None:
    query = _prometheus(
        {
            "sglang:num_requests_total": {"a/pd0": 100.0, "a/pd1": 50.0},
            "sglang:num_aborted_requests_total": {"a/pd0": 2.0},
            "sglang:num_transfer_failed_reqs_total": {"a/pd0": 1.0},
            "sglang:http_responses_total": {"a/pd1": 4.0},
            "sglang:time_to_first_token_seconds": {"a/pd0": 0.2, "a/pd1": math.nan},
            "sglang:inter_token_latency_seconds": {"a/pd0": 0.01, "a/pd1": 0.02},
        }
    )
    got = gate.measure(query, ["a/pd0", "a/pd1"], 300, per_group=True)
    assert got["a/pd0"] == Figures(
        requests=100, failed=3, kv_failures=1, ttft_p90_s=0.2, itl_p90_s=0.01
    )
    # no bootstrap or transfer series: 0 failures of those; NaN (no observations): no data
    assert got["a/pd1"] == Figures(
        requests=50, failed=4, kv_failures=0, ttft_p90_s=None, itl_p90_s=0.02
    )
    old = gate.measure(query, ["a/pd0", "a/pd1"], 300, per_group=False)[gate.OLD]
    assert old.requests == 150 and old.failed == 7


def test_queries_select_exactly_the_groups_and_count_one_rank() -> None:
    q = gate.queries(["node-a/pd0", "g.1"], 120, per_group=True)
    assert all('pair=~"node\\\\-a/pd0|g\\\\.1"' in e for exprs in q.values() for e in exprs)
    assert q["kv_failures"][0] == (
        "sum by (pair) (max without (tp_rank) (increase(sglang:num_transfer_failed_reqs_total"
        '{job="sglang", pair=~"node\\\\-a/pd0|g\\\\.1"}[120s])))'
    )
    assert q["itl_p90_s"][0].startswith("histogram_quantile(0.9, sum by (le, pair) (rate(")
    assert 'engine_type="decode"' in q["requests"][0]
    assert 'status_code!~"2.."' in q["failed"][3]
