"""Dashboards: committed JSON is what the source generates, and every board and panel keeps
the rules operators rely on (stable uid, datasource variable, units, descriptions, counters
only under rate/increase, engine metric names that sglang 0.5.23 emits)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from monitoring import build
from monitoring.build import DASHBOARDS_DIR
from monitoring.dashboards.export import expressions, panels, render_dashboards
from tests.conftest import ROOT
from tests.promql import counters_outside_rate, metric_names

SGLANG_METRICS = ROOT / "tests" / "data" / "sglang_0.5.23_metrics.txt"
BOARDS = {name: json.loads(text) for name, text in render_dashboards().items()}


def sglang_series_names() -> set[str]:
    names = set()
    for line in SGLANG_METRICS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()[:2]
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names |= {name + s for s in suffixes}
    return names


def test_committed_json_is_regenerated_source() -> None:
    assert build.main(["--check"]) == 0, "run python -m monitoring.build"
    assert sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")) == sorted(BOARDS)


def test_the_five_dashboards_exist() -> None:
    titles = {b["title"] for b in BOARDS.values()}
    assert titles == {
        "PD overview",
        "PD pipeline",
        "Decode efficiency",
        "GPUs and hosts",
        "Gateway",
    }


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_shape(name: str) -> None:
    board = BOARDS[name]
    assert "id" not in board
    assert board["uid"] == Path(name).stem and board["uid"].startswith("pdstack-")
    assert board["editable"] is False
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert len(variables) > 1, "a role/instance variable besides the datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels(board)]
    assert len(titles) == len(set(titles)), "titles name panels in tests and links"


def _panels() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{n}:{p['title']}", p) for n, b in sorted(BOARDS.items()) for p in panels(b)]


@pytest.mark.parametrize(("key", "panel"), _panels(), ids=[k for k, _ in _panels()])
def test_panel_shape(key: str, panel: dict[str, Any]) -> None:
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert panel.get("description"), key
    assert panel["fieldConfig"]["defaults"].get("unit"), key
    assert panel["targets"], key
    for target in panel["targets"]:
        expr = target["expr"]
        assert not counters_outside_rate(expr), (key, expr)
        # Ranges follow Grafana's scrape-aware interval, never a fixed window.
        assert not re.search(r"\[\d+[smhd]\]", expr), (key, expr)


def test_engine_metric_names_exist_in_the_pinned_sglang() -> None:
    known = sglang_series_names()
    used = {n for b in BOARDS.values() for _, e in expressions(b) for n in metric_names(e)}
    unknown = {n for n in used if n.startswith("sglang:")} - known
    assert not unknown
    assert not {n for n in used if n.startswith("sglang_")}, "engines emit sglang:*, not sglang_*"


def every_rank_counters() -> set[str]:
    """Counters each TP rank writes for the same event (tests/data/sglang_0.5.23_recording.txt)."""
    out = set()
    for line in (ROOT / "tests" / "data" / "sglang_0.5.23_recording.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _collector, ranks = line.split()[:3]
            if "every" in ranks.split(",") and name.endswith("_total"):
                out.add(name)
    return out


def test_rank_local_counters_are_counted_once_not_per_tp_rank() -> None:
    from tests.unit.test_monitoring_rules import rules

    exprs = [(b["uid"], t, e) for b in BOARDS.values() for t, e in expressions(b)]
    exprs += [("rules", r.get("record") or r["alert"], r["expr"]) for r in rules()]
    every = every_rank_counters()
    assert "sglang:num_transfer_failed_reqs_total" in every
    checked = 0
    for where, title, expr in exprs:
        for name in metric_names(expr) & every:
            checked += 1
            # `sum by` over the TP ranks of such a counter is TP times the truth.
            assert re.search(rf"max without \(tp_rank\) \(\w+\({re.escape(name)}\b", expr) or (
                f"{name}{{" in expr and 'tp_rank="0"' in expr
            ), (where, title, expr)
    assert checked >= 5
