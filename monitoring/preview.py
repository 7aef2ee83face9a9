"""Dashboard previews without Grafana: every panel of a generated dashboard evaluated against a
Prometheus over a time range, as Grafana would query it, and drawn with matplotlib on the
dashboard's own 24-column grid, one PNG per dashboard.

    python -m monitoring.preview --prometheus URL (--last 10m | --start T --end T) --out DIR \
        [--dashboard UID] [--scrape-interval 15s]

A panel the preview cannot draw faithfully (a panel type, unit or variable it does not know, a
query Prometheus rejects) is left blank with the reason in it and listed on stderr; the exit
status is then 1. A panel whose queries return nothing reads "No data", as in Grafana.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates
import requests
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from PIL import Image

from monitoring.build import DASHBOARDS_DIR

COLUMNS = 24
# Grafana's grid: 30 px rows with 8 px margins; the preview is a 1280 px wide dashboard.
WIDTH_PX, CELL_H_PX, DPI = 1280, 38, 80
PNG_COLORS = 128
HEADER_PX = 44
PALETTE = (
    "#7eb26d",
    "#eab839",
    "#6ed0e0",
    "#ef843c",
    "#e24d42",
    "#1f78c1",
    "#ba43a9",
    "#705da0",
    "#508642",
    "#cca300",
    "#447ebc",
    "#c15c17",
)
DEFAULT_THRESHOLDS: list[dict[str, Any]] = [
    {"color": "green", "value": None},
    {"color": "red", "value": 80},
]
COLORS = {
    "green": "#56a64b",
    "red": "#e02f44",
    "yellow": "#f2cc0c",
    "orange": "#ff9830",
    "blue": "#3274d9",
    "text": "#464c54",
}


# ---- time: Grafana's interval, $__rate_interval and the query step ----

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Grafana's roundInterval ladder (@grafana/data rangeutil), ms: below the bound -> the value.
_LADDER = (
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (750000, 600000),
    (1050000, 900000),
    (1500000, 1200000),
    (2700000, 1800000),
    (5400000, 3600000),
    (9000000, 7200000),
    (16200000, 10800000),
    (32400000, 21600000),
    (86400000, 43200000),
)


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus/Grafana duration (`90s`, `10m`, `1h30m`)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (examples: 30s, 10m, 1h)")
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def round_interval(ms: float) -> float:
    return next((value for bound, value in _LADDER if ms < bound), 86400000)


@dataclass(frozen=True)
class Intervals:
    """What Grafana substitutes for one panel: $__interval (also the query step) and
    $__rate_interval, in seconds."""

    interval: float
    rate_interval: float


def intervals(range_s: float, max_data_points: int, scrape_s: float) -> Intervals:
    """$__interval is the range over the panel's width in pixels (Grafana's max data points),
    rounded, and at least the data source's scrape interval; $__rate_interval is
    max($__interval + scrape interval, 4 x scrape interval)."""
    interval = max(round_interval(range_s * 1000 / max_data_points) / 1000, scrape_s)
    return Intervals(interval, max(interval + scrape_s, 4 * scrape_s))


def promql_duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms" if seconds % 1 else f"{int(seconds)}s"


# ---- variables and legends ----

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def variable_values(board: Mapping[str, Any]) -> dict[str, str]:
    """Each query variable as a dashboard opened with its defaults resolves it: "All", which
    Grafana sends as the variable's allValue. The datasource variable is the Prometheus
    queried; a variable without an allValue has no value here (its panels are not drawn)."""
    values = {}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query" and variable.get("includeAll") and "allValue" in variable:
            values[variable["name"]] = variable["allValue"]
    return values


def resolve(expr: str, values: Mapping[str, str], iv: Intervals) -> str:
    """The expression as Grafana sends it; ValueError names a variable it cannot resolve."""
    builtins = {
        "__interval": promql_duration(iv.interval),
        "__rate_interval": promql_duration(iv.rate_interval),
    }

    def value(m: re.Match[str]) -> str:
        name = m[1] or m[2]
        if name in builtins:
            return builtins[name]
        if name not in values:
            raise ValueError(f"variable ${name} has no default the preview can resolve")
        return values[name]

    return _VARIABLE.sub(value, expr)


_LEGEND_LABEL = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """A series' name as Grafana writes it from the target's legendFormat (a missing label is
    empty); without one, the metric name and its labels."""
    if fmt and fmt != "__auto":
        return _LEGEND_LABEL.sub(lambda m: labels.get(m[1], ""), fmt).strip()
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels.get('__name__', '')}{{{rest}}}"


# ---- units: Grafana's value formats for the units the dashboards use ----

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"))
_SHORT = ((1e12, " T"), (1e9, " Bil"), (1e6, " Mil"), (1e3, " K"), (1, ""))
_TIME = ((3600, " h"), (60, " min"), (1, " s"), (1e-3, " ms"), (1e-6, " µs"), (1e-9, " ns"))


def _si(unit: str) -> tuple[tuple[float, str], ...]:
    return tuple((factor, f" {prefix}{unit}") for factor, prefix in _SI)


def _number(x: float) -> str:
    """Three significant digits, never in exponent notation (units scale large values)."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:.0f}"
    text = f"{float(f'{x:.3g}'):f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _scaled(x: float, scales: Sequence[tuple[float, str]]) -> str:
    """x in the largest scale it reaches (the smallest for tiny values); 0 in the base one."""
    if x == 0 or not math.isfinite(x):
        base = next(suffix for factor, suffix in scales if factor == 1)
        return f"{_number(x)}{base}"
    factor, suffix = next(((f, s) for f, s in scales if abs(x) >= f * 0.9995), scales[-1])
    return f"{_number(x / factor)}{suffix}"


UNITS: dict[str, Callable[[float], str]] = {
    "none": _number,
    "short": lambda x: _scaled(x, _SHORT),
    "percentunit": lambda x: f"{_number(x * 100)}%",
    "s": lambda x: _scaled(x, _TIME),
    "ms": lambda x: _scaled(x / 1000, _TIME),
    "reqps": lambda x: f"{_number(x)} req/s",
    "ops": lambda x: f"{_number(x)} ops/s",
    "Bps": lambda x: _scaled(x, _si("B/s")),
    "GBs": lambda x: _scaled(x * 1e9, _si("B/s")),
    "decmbytes": lambda x: _scaled(x * 1e6, _si("B")),
    "gbytes": lambda x: f"{_number(x)} GiB",  # SGLang's *_gb gauges: bytes / 2**30
    "watt": lambda x: _scaled(x, _si("W")),
    "celsius": lambda x: f"{_number(x)} °C",
    "hertz": lambda x: _scaled(x, _si("Hz")),
}


SUFFIX = "suffix:"  # Grafana's custom unit: the value, then the text after the colon


def known_unit(unit: str) -> bool:
    return unit in UNITS or unit.startswith(SUFFIX)


def format_value(value: float, unit: str) -> str:
    """`value` as Grafana shows it in `unit` (KeyError for a unit the preview lacks)."""
    if unit.startswith(SUFFIX):
        return _number(value) + unit[len(SUFFIX) :]
    return UNITS[unit](value)


# ---- the grid ----


@dataclass(frozen=True)
class Cell:
    x: int
    y: int
    w: int
    h: int

    def overlaps(self, other: Cell) -> bool:
        return (
            self.x < other.x + other.w
            and other.x < self.x + self.w
            and self.y < other.y + other.h
            and other.y < self.y + self.h
        )


def cell(panel: Mapping[str, Any]) -> Cell:
    pos = panel["gridPos"]
    return Cell(pos["x"], pos["y"], pos["w"], pos["h"])


def grid_problems(board: Mapping[str, Any]) -> list[str]:
    """Panels (rows included) that overlap or leave the 24 columns."""
    placed = [(p["title"], cell(p)) for p in board["panels"]]
    problems = [f"{t} leaves the grid: {c}" for t, c in placed if c.x < 0 or c.x + c.w > COLUMNS]
    for i, (title, c) in enumerate(placed):
        problems += [f"{title} overlaps {t}" for t, o in placed[i + 1 :] if c.overlaps(o)]
    return problems


def panel_width_px(c: Cell) -> int:
    return round(c.w * WIDTH_PX / COLUMNS)


# ---- querying ----


@dataclass
class Series:
    name: str
    times: list[float]
    values: list[float]


@dataclass
class PanelPreview:
    """One panel as drawn: its series, or why it was not drawn."""

    title: str
    kind: str
    unit: str
    cell: Cell
    series: list[Series] = field(default_factory=list)
    not_drawn: str = ""
    step: float = 1.0  # the query step ($__interval), seconds
    y_ticks: list[str] = field(default_factory=list)  # the value axis' labels, as drawn

    @property
    def empty(self) -> bool:
        return not self.not_drawn and not any(
            any(math.isfinite(v) for v in s.values) for s in self.series
        )


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        r = self.session.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expr, "start": str(start), "end": str(end), "step": str(step)},
            timeout=30,
        )
        body = r.json()
        if body.get("status") != "success":
            raise ValueError(f"Prometheus: {body.get('error', r.status_code)}")
        return list(body["data"]["result"])


def evaluate(
    prom: Prometheus,
    panel: Mapping[str, Any],
    values: Mapping[str, str],
    start: float,
    end: float,
    scrape_s: float,
) -> PanelPreview:
    c = cell(panel)
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    preview = PanelPreview(panel["title"], panel["type"], unit, c)
    reason = why_not_drawn(panel, unit)
    if reason:
        preview.not_drawn = reason
        return preview
    iv = intervals(end - start, panel.get("maxDataPoints") or panel_width_px(c), scrape_s)
    preview.step = iv.interval
    # Grafana aligns the range to the step so that refreshes reuse the same points.
    first, last = math.floor(start / iv.interval) * iv.interval, end
    for target in panel.get("targets", []):
        try:
            expr = resolve(target["expr"], values, iv)
            result = prom.query_range(expr, first, last, iv.interval)
        except ValueError as e:
            preview.not_drawn = f"query {target.get('refId', '?')}: {e}"
            preview.series = []
            return preview
        for item in result:
            times = [float(t) for t, _ in item["values"]]
            preview.series.append(
                Series(
                    legend(target.get("legendFormat", ""), item["metric"]),
                    times,
                    [float(v) for _, v in item["values"]],
                )
            )
    return preview


KINDS = ("timeseries", "stat")
_DRAW_STYLES = ("line", "bars")


def why_not_drawn(panel: Mapping[str, Any], unit: str) -> str:
    """What in the panel the preview cannot draw as Grafana would ('' when nothing)."""
    if panel["type"] not in KINDS:
        return f"panel type {panel['type']!r} is not drawn by the preview"
    if not known_unit(unit):
        return f"unit {unit!r} is not known to the preview"
    if panel.get("transformations"):
        return "transformations are not applied by the preview"
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    if custom.get("drawStyle", "line") not in _DRAW_STYLES:
        return f"draw style {custom['drawStyle']!r} is not drawn by the preview"
    if panel.get("fieldConfig", {}).get("overrides"):
        return "field overrides are not applied by the preview"
    thresholds = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {})
    if thresholds.get("mode", "absolute") != "absolute":
        return f"{thresholds['mode']} thresholds are not drawn by the preview"
    calcs = panel.get("options", {}).get("reduceOptions", {}).get("calcs", ["lastNotNull"])
    if panel["type"] == "stat" and calcs not in ([], ["lastNotNull"]):
        return f"stat reductions {calcs} are not drawn by the preview (only lastNotNull)"
    if any(
        t.get("instant") or t.get("format", "time_series") != "time_series"
        for t in panel.get("targets", [])
    ):
        return "only range queries in time-series format are drawn"
    return ""


# ---- drawing ----


def _threshold_steps(panel: Mapping[str, Any]) -> list[dict[str, Any]]:
    thresholds = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds")
    return list(thresholds["steps"]) if thresholds else []


def _color(name: str) -> str:
    return COLORS.get(name, name)


def threshold_color(value: float, steps: Sequence[Mapping[str, Any]]) -> str:
    """The color of the highest step at or below `value` (the first step is the base)."""
    color = steps[0]["color"]
    for step in steps[1:]:
        if step["value"] is not None and value >= step["value"]:
            color = step["color"]
    return _color(color)


def last_value(s: Series) -> float:
    return next((v for v in reversed(s.values) if math.isfinite(v)), math.nan)


CALCS: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda vs: sum(vs) / len(vs),
    "max": max,
    "min": min,
    "lastNotNull": lambda vs: vs[-1],
}
CALC_NAMES = {"mean": "mean", "max": "max", "min": "min", "lastNotNull": "last"}


def legend_entry(s: Series, unit: str, calcs: Sequence[str]) -> str:
    finite = [v for v in s.values if math.isfinite(v)]
    if not finite:
        return s.name
    shown = "  ".join(
        f"{CALC_NAMES[c]} {format_value(CALCS[c](finite), unit)}" for c in calcs if c in CALCS
    )
    return f"{s.name}   {shown}" if shown else s.name


def _day(t: float) -> float:
    """Unix seconds as matplotlib's date numbers (days since its 1970 epoch)."""
    return t / 86400


def _with_gaps(s: Series, step: float) -> tuple[list[float], list[float]]:
    """Points (date numbers) with a NaN wherever a scrape is missing, so the line breaks as
    Grafana's does."""
    times: list[float] = []
    values: list[float] = []
    for i, (t, v) in enumerate(zip(s.times, s.values, strict=True)):
        if i and t - s.times[i - 1] > 1.5 * step:
            times.append(_day(t - step))
            values.append(math.nan)
        times.append(_day(t))
        values.append(v)
    return times, values


class Canvas:
    """Figure coordinates for grid cells: y grows downwards from under the header."""

    def __init__(self, board: Mapping[str, Any]) -> None:
        rows = max(c.y + c.h for c in map(cell, board["panels"]))
        self.height_px = HEADER_PX + rows * CELL_H_PX + 8
        self.fig = Figure(figsize=(WIDTH_PX / DPI, self.height_px / DPI), dpi=DPI)
        self.fig.patch.set_facecolor("#f4f5f5")

    def box(
        self, c: Cell, top: float = 0, bottom: float = 0, left: float = 0, side: float = 0
    ) -> tuple[float, float, float, float]:
        """(left, bottom, width, height) of the cell in figure fractions, inset by pixels:
        `side` on both sides, `left` more on the left."""
        margin = 4
        x = c.x * WIDTH_PX / COLUMNS + margin + side + left
        width = c.w * WIDTH_PX / COLUMNS - 2 * (margin + side) - left
        top_px = HEADER_PX + c.y * CELL_H_PX + margin + top
        height = c.h * CELL_H_PX - 2 * margin - top - bottom
        return (
            x / WIDTH_PX,
            1 - (top_px + height) / self.height_px,
            width / WIDTH_PX,
            height / self.height_px,
        )

    def text(self, x_px: float, y_px: float, s: str, **kw: Any) -> None:
        self.fig.text(x_px / WIDTH_PX, 1 - y_px / self.height_px, s, **kw)


def draw_panel(
    canvas: Canvas, panel: Mapping[str, Any], p: PanelPreview, window: tuple[float, float]
) -> None:
    frame = canvas.fig.add_axes(canvas.box(p.cell))
    frame.set_xticks([])
    frame.set_yticks([])
    frame.set_facecolor("white")
    for spine in frame.spines.values():
        spine.set_color("#d8d9da")
    frame.set_zorder(0)
    frame.text(
        0.01,
        1 - 6 / (p.cell.h * CELL_H_PX),
        p.title,
        transform=frame.transAxes,
        va="top",
        fontsize=9,
        weight="bold",
        color=COLORS["text"],
    )
    if p.not_drawn:
        frame.text(
            0.5,
            0.5,
            f"not drawn: {p.not_drawn}",
            transform=frame.transAxes,
            ha="center",
            va="center",
            fontsize=8,
            color=COLORS["red"],
            wrap=True,
        )
        return
    if p.empty:
        frame.text(
            0.5,
            0.45,
            "No data",
            transform=frame.transAxes,
            ha="center",
            va="center",
            fontsize=11,
            color="#8e8e8e",
        )
        return
    if p.kind == "stat":
        draw_stat(frame, panel, p)
    else:
        draw_timeseries(canvas, panel, p, window)


def draw_stat(frame: Any, panel: Mapping[str, Any], p: PanelPreview) -> None:
    steps = _threshold_steps(panel) or DEFAULT_THRESHOLDS
    shown = [s for s in p.series if math.isfinite(last_value(s))]
    for i, s in enumerate(shown):
        x = (i + 0.5) / len(shown)
        value = last_value(s)
        frame.text(
            x,
            0.45,
            format_value(value, p.unit),
            transform=frame.transAxes,
            ha="center",
            va="center",
            fontsize=22,
            weight="bold",
            color=threshold_color(value, steps),
        )
        frame.text(
            x,
            0.12,
            s.name,
            transform=frame.transAxes,
            ha="center",
            va="center",
            fontsize=7,
            color=COLORS["text"],
        )


LEGEND_LINE_PX = 11
AXIS_LABELS_PX = 44
PLOT_MIN_PX = 90


def draw_timeseries(
    canvas: Canvas, panel: Mapping[str, Any], p: PanelPreview, window: tuple[float, float]
) -> None:
    options = panel.get("options", {}).get("legend", {})
    show_legend = options.get("showLegend", True) and options.get("displayMode") != "hidden"
    series = [s for s in p.series if any(math.isfinite(v) for v in s.values)]
    height = p.cell.h * CELL_H_PX - 8
    room = max(0, (height - 24 - PLOT_MIN_PX - 18) // LEGEND_LINE_PX) if show_legend else 0
    listed = series if len(series) <= room else series[: max(room - 1, 0)]
    more = len(series) - len(listed)
    legend_px = (len(listed) + (1 if more else 0)) * LEGEND_LINE_PX + 18 if show_legend else 14
    ax = canvas.fig.add_axes(
        canvas.box(p.cell, top=24, bottom=legend_px, left=AXIS_LABELS_PX, side=8)
    )
    ax.set_zorder(1)
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    bars = custom.get("drawStyle") == "bars"
    stacked = custom.get("stacking", {}).get("mode", "none") not in ("none", "")
    fill = custom.get("fillOpacity", 0) / 100
    step = p.step
    base: dict[float, float] = {}  # stacked: the top so far at each time
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        times, values = _with_gaps(s, step)
        if stacked:
            bottoms = [base.get(t, 0.0) for t in times]
            values = [b + v for b, v in zip(bottoms, values, strict=True)]
            base.update((t, v) for t, v in zip(times, values, strict=True) if math.isfinite(v))
            ax.fill_between(times, bottoms, values, color=color, alpha=max(fill, 0.3), lw=0)
        if bars:
            ax.bar(times, values, width=_day(step) * 0.8, color=color, alpha=0.8)
        else:
            ax.plot(times, values, color=color, lw=1.2)
            if fill and not stacked:
                ax.fill_between(times, values, color=color, alpha=fill, lw=0)
    for step_ in _threshold_steps(panel)[1:]:
        if custom.get("thresholdsStyle", {}).get("mode", "off") != "off":
            ax.axhline(step_["value"], color=_color(step_["color"]), lw=1, ls="--")
    start, end = window
    ax.set_xlim(_day(start), _day(end))
    ax.xaxis.set_major_formatter(
        mdates.DateFormatter("%H:%M" if end - start > 1800 else "%H:%M:%S", tz=UTC)
    )
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=7, tz=UTC))
    ax.yaxis.set_major_locator(MaxNLocator(4))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, p.unit)))
    # Grafana's axis starts at 0 for data that never goes below, and spans 0-1 for zeros.
    finite = [v for s in series for v in s.values if math.isfinite(v)]
    high = ax.get_ylim()[1]
    if min(finite) >= 0:
        ax.set_ylim(0, high if max(finite) > 0 else 1)
    low, high = ax.get_ylim()
    p.y_ticks = [format_value(v, p.unit) for v in ax.get_yticks() if low <= v <= high]
    ax.tick_params(labelsize=7, colors=COLORS["text"])
    ax.grid(True, color="#eeeeee", lw=0.6)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if show_legend:
        calcs = options.get("calcs", [])
        left, *_ = canvas.box(p.cell, side=8)
        lines = [legend_entry(s, p.unit, calcs) for s in listed]
        lines += [f"… and {more} more series"] if more else []
        y_top = HEADER_PX + (p.cell.y + p.cell.h) * CELL_H_PX - 4 - legend_px + 16
        for i, line in enumerate(lines):
            color = PALETTE[i % len(PALETTE)] if i < len(listed) else COLORS["text"]
            canvas.text(
                left * WIDTH_PX, y_top + i * LEGEND_LINE_PX, "▬", color=color, fontsize=7, va="top"
            )
            canvas.text(
                left * WIDTH_PX + 12,
                y_top + i * LEGEND_LINE_PX,
                line,
                fontsize=6.5,
                va="top",
                color=COLORS["text"],
                family="monospace",
            )


def draw_row(canvas: Canvas, panel: Mapping[str, Any]) -> None:
    c = cell(panel)
    y = HEADER_PX + c.y * CELL_H_PX + CELL_H_PX / 2
    canvas.text(8, y, panel["title"], fontsize=11, weight="bold", va="center", color="#1f1f20")


@dataclass
class DashboardPreview:
    uid: str
    title: str
    panels: list[PanelPreview]
    grid_problems: list[str]


def render(
    board: Mapping[str, Any],
    prom: Prometheus,
    start: float,
    end: float,
    scrape_s: float,
    out: Path,
) -> DashboardPreview:
    """Evaluate every panel over [start, end] and write the dashboard's PNG to `out`."""
    values = variable_values(board)
    canvas = Canvas(board)
    previews = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            draw_row(canvas, panel)
            continue
        p = evaluate(prom, panel, values, start, end, scrape_s)
        draw_panel(canvas, panel, p, (start, end))
        previews.append(p)
    span = f"{_utc(start)} to {_utc(end)} UTC"
    variables = ", ".join(f"{name}=All" for name in values) or "no variables"
    canvas.text(8, 16, board["title"], fontsize=14, weight="bold", va="center", color="#1f1f20")
    canvas.text(
        8,
        34,
        f"{span}   ·   {variables}   ·   scrape interval {promql_duration(scrape_s)}"
        f"   ·   preview from {prom.url}",
        fontsize=8,
        va="center",
        color=COLORS["text"],
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    canvas.fig.savefig(png, format="png", dpi=DPI, facecolor=canvas.fig.get_facecolor())
    # A palette of PNG_COLORS keeps a dashboard's picture small enough for the docs.
    with Image.open(png) as image:
        image.convert("RGB").quantize(PNG_COLORS, Image.Quantize.FASTOCTREE).save(
            out, optimize=True
        )
    return DashboardPreview(board["uid"], board["title"], previews, grid_problems(board))


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def boards(uid: str | None = None) -> list[dict[str, Any]]:
    """The committed dashboard JSON, or the one with `uid` (ValueError when none has it)."""
    found = [json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))]
    chosen = [b for b in found if uid in (None, b["uid"])]
    if not chosen:
        raise ValueError(f"no dashboard {uid!r}; have {', '.join(b['uid'] for b in found)}")
    return chosen


def report(previews: Iterable[DashboardPreview]) -> tuple[list[str], bool]:
    """Lines for a person, and whether every panel was drawn on a sound grid."""
    lines, ok = [], True
    for d in previews:
        drawn = [p for p in d.panels if not p.not_drawn]
        empty = [p.title for p in drawn if p.empty]
        lines.append(
            f"{d.uid}: {len(drawn)}/{len(d.panels)} panels drawn"
            + (f", no data in: {', '.join(empty)}" if empty else "")
        )
        for p in d.panels:
            if p.not_drawn:
                ok = False
                lines.append(f"  NOT DRAWN {p.title}: {p.not_drawn}")
        for problem in d.grid_problems:
            ok = False
            lines.append(f"  GRID {problem}")
    return lines, ok


def time_range(args: argparse.Namespace) -> tuple[float, float]:
    if args.last:
        end = time.time()
        return end - parse_duration(args.last), end
    if args.start is None or args.end is None:
        raise ValueError("give --last, or both --start and --end")
    start, end = (_timestamp(v) for v in (args.start, args.end))
    if end <= start:
        raise ValueError(f"--end ({args.end}) is not after --start ({args.start})")
    return start, end


def _timestamp(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC when it has no offset)."""
    try:
        return float(text)
    except ValueError:
        parsed = datetime.fromisoformat(text)
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--last", help="the range ending now, e.g. 10m")
    ap.add_argument("--start", help="unix seconds or ISO 8601 (UTC unless an offset is given)")
    ap.add_argument("--end", help="unix seconds or ISO 8601")
    ap.add_argument("--out", type=Path, required=True, help="directory for UID.png")
    ap.add_argument("--dashboard", help="one dashboard uid (default: all)")
    ap.add_argument(
        "--scrape-interval",
        default="15s",
        help="the Grafana data source's scrape interval (default 15s, the role's)",
    )
    args = ap.parse_args(argv)
    try:
        start, end = time_range(args)
        scrape_s = parse_duration(args.scrape_interval)
        chosen = boards(args.dashboard)
    except ValueError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    prom = Prometheus(args.prometheus)
    previews = [render(b, prom, start, end, scrape_s, args.out / f"{b['uid']}.png") for b in chosen]
    lines, ok = report(previews)
    print("\n".join(lines), file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
