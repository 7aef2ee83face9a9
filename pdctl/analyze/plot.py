"""PNG of decode tok/s against running requests, with the graph buckets marked."""

from __future__ import annotations

from pathlib import Path

# Figure without pyplot: no GUI backend or global state, so it works headless on a GPU host.
from matplotlib.figure import Figure

from pdctl.analyze.buckets import padded
from pdctl.analyze.report import JournalReport


def plot_journal(report: JournalReport, out: Path) -> None:
    rows = report.table.sorted_rows()
    fig = Figure(figsize=(9, 5), dpi=100)
    ax = fig.subplots()
    graph = [(r.running, tps, r.graph_lines) for r in rows if (tps := r.graph_mean_tps)]
    # mean tok/s of the eager lines (what the graph points show too; the step time would
    # need the accept length under speculation)
    eager = [
        (r.running, (r.tps_sum - r.graph_tps_sum) / r.eager_lines) for r in rows if r.eager_lines
    ]
    if graph:
        ax.scatter(
            [g[0] for g in graph],
            [g[1] for g in graph],
            s=[min(80.0, 8 + g[2] ** 0.5) for g in graph],
            label="graph (mean per batch size)",
        )
    if eager:
        ax.scatter(
            [e[0] for e in eager],
            [e[1] for e in eager],
            color="tab:red",
            marker="x",
            label="eager",
        )
    if report.law is not None and rows:
        fit = report.law.fit
        # The law in graph mode only: up to the largest graph, each batch padded to its bucket.
        top_bs = report.max_graph or rows[-1].running
        buckets = sorted({*report.buckets, top_bs}) if report.buckets else []
        xs = list(range(1, top_bs + 1))
        accept = report.law.accept_len or 1.0  # tokens per request per step
        ax.plot(
            xs,
            [1000.0 * accept * x / fit.at(padded(x, buckets) if buckets else x) for x in xs],
            color="tab:gray",
            linewidth=1,
            label=f"fit {fit.a:.1f} + {fit.b:.2f}·bs ms"
            + (f" per step, accept len {accept:.2f}" if report.law.accept_len else ""),
        )
        if (top := report.law.asymptote_tps) is not None:
            ax.axhline(top, color="tab:gray", linestyle=":", linewidth=1)
            ax.annotate(f"asymptote {top:,.0f} tok/s", (1, top), va="bottom", fontsize=8)
    for i, b in enumerate(report.buckets):
        ax.axvline(
            b + 0.5,
            color="tab:orange",
            alpha=0.5,
            linewidth=1,
            label="graph bucket boundary" if i == 0 else None,
        )
    if report.max_graph:
        ax.axvline(
            report.max_graph + 0.5,
            color="tab:red",
            linestyle="--",
            linewidth=1,
            label=f"largest graph ({report.max_graph})",
        )
    ax.set_xlabel("running requests (decode batch)")
    ax.set_ylabel("aggregate gen tok/s")
    ax.set_title("Decode throughput by running requests")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
