"""Typed helpers over grafana-foundation-sdk: every panel gets a unit, a description and the
`$datasource` variable; a layout places panels on Grafana's 24-column grid."""

from __future__ import annotations

from dataclasses import dataclass, field

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Row
from grafana_foundation_sdk.models.common import (
    GraphDrawStyle,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from monitoring.config import Config
from monitoring.queries import quantile

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's custom unit: the value, then the suffix (token rates read as such, not as "2.4 K").
TOKENS_PER_S = "suffix: tok/s"


def engine_selector(cfg: Config) -> str:
    """The engines' series narrowed by the dashboard's variables (the scrape config adds the
    pair/role/engine labels; pair: a pair's or group's id, HOST/NAME)."""
    return f'{cfg.selectors.engines}, pair=~"$pair", role=~"$role", engine=~"$engine"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def quantiles(
    histogram: str, selector: str, by: str, qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> list[Query]:
    """A query per quantile q, legended by `by`."""
    return [
        Query(
            quantile(q, histogram, selector, by),
            f"p{round(q * 100)} {{{{{by}}}}}",
        )
        for q in qs
    ]


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: list[Query]
    kind: str = "timeseries"  # timeseries | stat | bars
    width: int = 12
    height: int = 8
    stack: bool = False
    # (from value, color) steps, the first from -inf (None): a stat's color, a dashed line on
    # a time series.
    thresholds: tuple[tuple[float | None, str], ...] = ()


# A 0/1 health reading: red at 0, green at 1 (Grafana's default steps show 0 green).
UP_THRESHOLDS: tuple[tuple[float | None, str], ...] = ((None, "red"), (1, "green"))


@dataclass
class Section:
    title: str
    panels: list[Panel] = field(default_factory=list)


def _targets(panel: Panel) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i))
        for i, q in enumerate(panel.queries)
    ]


def _build(panel: Panel, panel_id: int, pos: GridPos) -> timeseries.Panel | stat.Panel:
    built: timeseries.Panel | stat.Panel
    if panel.kind == "stat":
        built = stat.Panel()
    else:
        built = (
            timeseries.Panel()
            .legend(
                common.VizLegendOptions()
                .display_mode(LegendDisplayMode.TABLE)
                .placement(LegendPlacement.BOTTOM)
                .show_legend(True)
                .calcs(["mean", "max", "lastNotNull"])
            )
            .fill_opacity(10)
        )
        if panel.kind == "bars":
            built = built.draw_style(GraphDrawStyle.BARS)
        if panel.stack:
            built = built.stacking(common.StackingConfig().mode(StackingMode.NORMAL))
        if panel.thresholds:
            built = built.thresholds_style(
                common.GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
            )
    if panel.thresholds:
        steps = [Threshold(value, color) for value, color in panel.thresholds]
        built = built.thresholds(
            dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)
        )
    built = built.id(panel_id).title(panel.title).description(panel.description).unit(panel.unit)
    built = built.datasource(DATASOURCE).grid_pos(pos)
    for target in _targets(panel):
        built = built.with_target(target)
    return built


def query_variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def engine_variables(cfg: Config) -> list[dashboard.QueryVariable]:
    """group (label pair: a pair is a 1P1D group) -> role -> engine (a member), each narrowed
    by the ones before it."""
    up = cfg.selectors.engines
    return [
        query_variable("pair", "Group", f"label_values(up{{{up}}}, pair)"),
        query_variable("role", "Role", f'label_values(up{{{up}, pair=~"$pair"}}, role)'),
        query_variable(
            "engine",
            "Engine",
            f'label_values(up{{{up}, pair=~"$pair", role=~"$role"}}, engine)',
        ),
    ]


def build_dashboard(
    uid: str,
    title: str,
    description: str,
    sections: list[Section],
    variables: list[dashboard.QueryVariable],
    cfg: Config,
) -> dashboard.Dashboard:
    source = dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    if cfg.datasource:
        source = source.current(
            VariableOption(selected=True, text=cfg.datasource, value=cfg.datasource)
        )
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["pdstack", "sglang"])
        .readonly()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(source)
    )
    for variable in variables:
        board = board.with_variable(variable)
    panel_id, y = 1, 0
    for section in sections:
        board = board.with_row(
            Row(section.title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=y))
        )
        panel_id, y, x, row_height = panel_id + 1, y + 1, 0, 0
        for panel in section.panels:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            board = board.with_panel(
                _build(panel, panel_id, GridPos(h=panel.height, w=panel.width, x=x, y=y))
            )
            panel_id, x, row_height = panel_id + 1, x + panel.width, max(row_height, panel.height)
        y += row_height
    return board
