"""monitoring.preview's pure parts: Grafana's intervals, variables, legends, units and the grid,
on the committed dashboards and on small made-up ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from monitoring.dashboards.export import render_dashboards
from monitoring.preview import (
    Cell,
    Intervals,
    format_value,
    grid_problems,
    intervals,
    known_unit,
    legend,
    parse_duration,
    promql_duration,
    resolve,
    round_interval,
    threshold_color,
    variable_values,
    why_not_drawn,
)

BOARDS = [json.loads(text) for text in render_dashboards().values()]


@pytest.mark.parametrize(
    ("ms", "rounded"),
    [(9, 1), (14, 10), (900, 1000), (1600, 2000), (14_000, 15_000), (50_000, 60_000),
     (100_000, 120_000), (4_000_000, 3_600_000)],
)  # fmt: skip
def test_round_interval_follows_grafanas_ladder(ms: float, rounded: float) -> None:
    assert round_interval(ms) == rounded


def test_rate_interval_is_four_scrapes_at_least() -> None:
    # 10 minutes over a 640 px panel: 0.94 s, rounded to 1 s, raised to the 15 s scrape.
    assert intervals(600, 640, 15) == Intervals(15, 60)
    # A 1 s scrape: $__interval 1 s, $__rate_interval max(1 + 1, 4 x 1).
    assert intervals(600, 640, 1) == Intervals(1, 4)


def test_rate_interval_is_interval_plus_scrape_on_long_ranges() -> None:
    # 24 hours over 640 px: 135 s, rounded to 2 min; 2 min + 15 s beats 4 x 15 s.
    assert intervals(86_400, 640, 15) == Intervals(120, 135)


def test_durations_round_trip() -> None:
    assert parse_duration("10m") == 600
    assert parse_duration("1h30m") == 5400
    assert promql_duration(135) == "135s"
    assert promql_duration(0.5) == "500ms"
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("10 minutes")


def test_variables_resolve_to_all_and_builtins_to_the_panels_intervals() -> None:
    overview = next(b for b in BOARDS if b["uid"] == "pdstack-overview")
    values = variable_values(overview)
    assert values == {"pair": ".*", "role": ".*", "engine": ".*"}
    expr = 'sum(rate(x{pair=~"$pair", engine=~"${engine}"}[$__rate_interval])) [$__interval]'
    assert (
        resolve(expr, values, Intervals(2, 6)) == 'sum(rate(x{pair=~".*", engine=~".*"}[6s])) [2s]'
    )
    with pytest.raises(ValueError, match=r"\$gpu has no default"):
        resolve('x{gpu=~"$gpu"}', values, Intervals(1, 4))


def test_every_committed_panel_resolves() -> None:
    for board in BOARDS:
        values = variable_values(board)
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                assert "$" not in resolve(target["expr"], values, Intervals(1, 4)), panel["title"]


def test_legend_fills_labels_and_falls_back_to_the_series() -> None:
    labels = {"__name__": "up", "engine": "h/pd0-decode", "role": "decode"}
    assert legend("p95 {{engine}}", labels) == "p95 h/pd0-decode"
    assert legend("{{ role }} {{missing}}", labels) == "decode"
    assert legend("", labels) == 'up{engine="h/pd0-decode", role="decode"}'
    assert legend("__auto", {"le": "0.5"}) == '{le="0.5"}'


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [(0.0123, "s", "12.3 ms"), (250, "ms", "250 ms"), (2e-5, "s", "20 µs"), (0, "s", "0 s"),
     (12_345, "short", "12.3 K"), (0.953, "percentunit", "95.3%"), (2.5e6, "Bps", "2.5 MB/s"),
     (0.5, "GBs", "500 MB/s"), (12, "decmbytes", "12 MB"), (1.41e9, "hertz", "1.41 GHz"),
     (3.2, "reqps", "3.2 req/s"), (2400, "suffix: tok/s", "2400 tok/s"),
     (2.5e-5, "none", "0.000025"), (71, "celsius", "71 °C"), (36.5, "gbytes", "36.5 GiB")],
)  # fmt: skip
def test_units_read_as_grafana_writes_them(value: float, unit: str, shown: str) -> None:
    assert format_value(value, unit) == shown


def test_every_committed_panel_has_a_unit_the_preview_draws() -> None:
    for board in BOARDS:
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert known_unit(panel["fieldConfig"]["defaults"]["unit"]), panel["title"]
                assert why_not_drawn(panel, panel["fieldConfig"]["defaults"]["unit"]) == ""


def panel(kind: str = "timeseries", **extra: Any) -> dict[str, Any]:
    return {"type": kind, "title": "t", "targets": [], "gridPos": {}, **extra}


def test_what_the_preview_refuses_to_draw() -> None:
    assert "panel type 'heatmap'" in why_not_drawn(panel("heatmap"), "s")
    assert "unit 'bytes'" in why_not_drawn(panel(), "bytes")
    assert "transformations" in why_not_drawn(panel(transformations=[{"id": "merge"}]), "s")
    assert "draw style 'points'" in why_not_drawn(
        panel(fieldConfig={"defaults": {"custom": {"drawStyle": "points"}}}), "s"
    )
    assert "range queries" in why_not_drawn(panel(targets=[{"instant": True}]), "s")
    percentage = {"defaults": {"thresholds": {"mode": "percentage", "steps": []}}}
    assert "percentage thresholds" in why_not_drawn(panel(fieldConfig=percentage), "s")
    mean = {"reduceOptions": {"calcs": ["mean"]}}
    assert "stat reductions ['mean']" in why_not_drawn(panel("stat", options=mean), "none")


def test_threshold_colors_pick_the_highest_step_reached() -> None:
    steps = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
    assert threshold_color(0, steps) != threshold_color(1, steps)
    assert threshold_color(1, steps) == threshold_color(5, steps)


def board_of(*cells: tuple[int, int, int, int]) -> dict[str, Any]:
    return {
        "panels": [
            {"title": f"p{i}", "gridPos": dict(zip("xywh", c, strict=True))}
            for i, c in enumerate(cells)
        ]
    }


def test_grid_finds_overlaps_and_panels_off_the_grid() -> None:
    assert grid_problems(board_of((0, 0, 12, 8), (12, 0, 12, 8), (0, 8, 24, 1))) == []
    assert grid_problems(board_of((0, 0, 12, 8), (11, 4, 6, 8))) == ["p0 overlaps p1"]
    assert grid_problems(board_of((18, 0, 8, 4))) == [
        "p0 leaves the grid: " + str(Cell(18, 0, 8, 4))
    ]


def test_committed_dashboards_sit_on_a_sound_grid() -> None:
    for board in BOARDS:
        assert grid_problems(board) == [], board["uid"]
