"""PNG of a sweep: output tok/s and TPOT against concurrency, with the TPOT fit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Figure without pyplot: no GUI backend or global state, so it works headless on a GPU host.
from matplotlib.figure import Figure

from pdctl.analyze.fit import LinearFit


def plot_sweep(rows: Sequence[dict[str, Any]], fit: LinearFit | None, out: Path) -> None:
    rows = sorted(rows, key=lambda r: r["max_concurrency"])
    cs = [r["max_concurrency"] for r in rows]
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.subplots()
    ax.plot(
        cs, [r["output_throughput"] for r in rows], "o-", color="tab:blue", label="output tok/s"
    )
    ax.set_xlabel("concurrency (max in-flight requests)")
    ax.set_ylabel("output tok/s", color="tab:blue")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    tp = ax.twinx()
    tp.plot(cs, [r["mean_tpot_ms"] for r in rows], "s-", color="tab:red", label="mean TPOT ms")
    tp.set_ylabel("mean TPOT ms", color="tab:red")
    if fit is not None and cs:
        xs = [cs[0] + (cs[-1] - cs[0]) * i / 50 for i in range(51)]
        label = f"TPOT fit {fit.a:.1f} + {fit.b:.2f}·C"
        if (top := fit.asymptote_tps) is not None:
            label += f" (→ {top:,.0f} tok/s)"
            ax.axhline(top, color="tab:blue", linestyle=":", linewidth=1)
        tp.plot(xs, [fit.at(x) for x in xs], "--", color="tab:red", linewidth=1, label=label)
    lines = ax.get_legend_handles_labels()
    more = tp.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    ax.set_title("Concurrency sweep")
    fig.tight_layout()
    fig.savefig(out)
