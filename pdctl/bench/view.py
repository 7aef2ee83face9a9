"""Terminal output of `pdctl bench`: a progress bar per level and the tables at the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from pdctl.analyze.fit import LinearFit
from pdctl.analyze.report import fmt_num
from pdctl.bench.compare import COMPARED, LevelComparison
from pdctl.bench.level import Level


class RichProgress:
    """One bar per level (requests done of the level's prompts; a spinner for the sglang
    driver, whose progress is inside its own process)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start_level(self, level: Level, total: int | None) -> None:
        self._task = self._progress.add_task(
            f"{level.label:<6} {level.num_prompts} prompts", total=total
        )

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)

    def end_level(self) -> None:
        if self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, total=task.total or 1, completed=task.total or 1)
            self._task = None


def _server(row: dict[str, Any], key: str, stat: str, digits: int) -> str:
    return fmt_num(row.get("server", {}).get(key, {}).get(stat), digits)


def _level(row: dict[str, Any]) -> str:
    """C for a closed-loop level, the rate for an open-loop one."""
    if row["max_concurrency"] is None:
        return f"{row['request_rate']:g}/s"
    return str(row["max_concurrency"])


def sweep_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="Concurrency sweep", title_justify="left", caption_justify="left")
    cols = (
        "C or rate", "done", "out tok/s", "req/s", "TTFT mean", "TTFT p50", "TTFT p99",
        "TPOT mean", "TPOT p50", "ITL p99", "e2e p50", "srv running", "graph", "KV use",
    )  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        failed = r.get("failed", 0)
        t.add_row(
            _level(r),
            f"{r['completed']}" + (f" [red]({failed} failed)[/red]" if failed else ""),
            fmt_num(r["output_throughput"]),
            fmt_num(r["request_throughput"], 2),
            fmt_num(r["mean_ttft_ms"], 0),
            fmt_num(r["median_ttft_ms"], 0),
            fmt_num(r["p99_ttft_ms"], 0),
            fmt_num(r["mean_tpot_ms"]),
            fmt_num(r["median_tpot_ms"]),
            fmt_num(r["p99_itl_ms"]),
            fmt_num(r["median_e2e_latency_ms"], 0),
            _server(r, "num_running_reqs", "max", 0),
            _server(r, "is_cuda_graph", "mean", 2),
            _server(r, "token_usage", "max", 2),
        )
    t.caption = (
        "latencies in ms; srv running = max running requests on the decode engines; graph = "
        "mean of sglang:is_cuda_graph (1: always in a CUDA graph); KV use = max token_usage"
    )
    return t


def fit_line(fit: LinearFit | None) -> str:
    if fit is None:
        return "TPOT fit: needs two levels with completed requests"
    top = fit.asymptote_tps
    ceiling = f"asymptote {top:,.0f} tok/s" if top is not None else "no ceiling (b <= 0)"
    return f"TPOT = {fit.a:.2f} ms + {fit.b:.3f} ms x C (R² {fit.r2:.3f}); {ceiling}"


def compare_table(levels: Sequence[LevelComparison], before: str, after: str) -> Table:
    t = Table(title=f"{before} → {after}", title_justify="left")
    t.add_column("C", justify="right")
    for _, label, _ in COMPARED:
        t.add_column(label, justify="right")
    for lv in levels:
        cells = []
        for d in lv.deltas:
            pct = d.pct
            color = {True: "green", False: "red", None: "default"}[d.better]
            delta = f" [{color}]{pct:+.1f}%[/{color}]" if pct is not None else ""
            cells.append(f"{fmt_num(d.before)} → {fmt_num(d.after)}{delta}")
        t.add_row(str(lv.concurrency), *cells)
    return t
