"""One pass over a journal stream into the findings `pdctl analyze journal` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, BinaryIO

from rich.console import Console
from rich.table import Table

from pdctl.analyze.buckets import (
    EagerOverflow,
    SawtoothDrop,
    eager_overflow,
    find_sawtooth,
    recommend_buckets,
)
from pdctl.analyze.decode_table import DecodeTable
from pdctl.analyze.fit import LinearFit, StepLaw, prefill_law, step_time_law
from pdctl.analyze.logparse import (
    ANY_TIME,
    DecodeTally,
    ScanCounts,
    TimeWindow,
    scan,
    scan_tallies,
)


@dataclass
class JournalReport:
    table: DecodeTable
    counts: ScanCounts
    max_graph: int | None  # given by the operator, else the largest batch seen in a graph
    sawtooth: list[SawtoothDrop] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)  # bucket sizes the sawtooth reveals
    law: StepLaw | None = None
    overflow: EagerOverflow | None = None
    recommended: list[int] = field(default_factory=list)
    prefill_law: LinearFit | None = None

    def as_dict(self) -> dict[str, Any]:
        t = self.table
        return {
            "input": {
                "lines": self.counts.lines,
                "bytes": self.counts.bytes,
                "decode_lines": t.decode_lines,
                "prefill_lines": t.prefill.lines,
                # `/health` generations (decode_table.is_health_check), left out of the rest
                "health_check_lines": t.prefill.health_checks,
                "idle_decode_lines": t.idle_lines,
                "unparseable": self.counts.unparseable,
                "out_of_range": self.counts.out_of_range,
                "untimed": self.counts.untimed,
            },
            "accept_len": t.accept_len,
            "decode": [
                {
                    "running": r.running,
                    "lines": r.lines,
                    "mean_gen_tok_s": r.mean_tps,
                    "tok_s_per_request": r.tps_per_request,
                    "eager_lines": r.eager_lines,
                    "graph_step_ms": r.graph_step_ms,
                    "eager_step_ms": r.eager_step_ms,
                    "accept_len": r.mean_accept_len,
                }
                for r in t.sorted_rows()
            ],
            "prefill": {
                "lines": t.prefill.lines,
                "new_tokens": t.prefill.new_tokens,
                "cached_tokens": t.prefill.cached_tokens,
                "max_queue": t.prefill.max_queue,
                "mean_input_tok_s": t.prefill.mean_input_tps,
                "busy_lines": t.prefill.busy_lines,
                # ms per batch = a_ms + b_ms x new tokens
                "fit": None if self.prefill_law is None else self.prefill_law.as_dict(),
            },
            "step_time_fit": None if self.law is None else self.law.as_dict(),
            "sawtooth": [
                {
                    "boundary": d.boundary,
                    "tok_s_at": d.tps_at,
                    "tok_s_after": d.tps_after,
                    "drop_pct": d.drop_pct,
                }
                for d in self.sawtooth
            ],
            "graph_buckets": self.buckets,
            "max_graph_bs": self.max_graph,
            "eager_overflow": (
                None
                if self.overflow is None
                else {
                    "max_graph_bs": self.overflow.max_graph,
                    "lines": self.overflow.lines,
                    "largest_batch": self.overflow.largest_batch,
                }
            ),
            "recommended_cuda_graph_bs_decode": self.recommended,
            "engine_flags": t.flags,
        }


def analyze_stream(
    stream: BinaryIO, window: TimeWindow = ANY_TIME, max_graph: int | None = None
) -> JournalReport:
    counts = ScanCounts()
    table = DecodeTable()
    if window.active:  # each line's timestamp is needed
        for batch in scan(stream, counts, window):
            table.add(batch)
    else:
        for item in scan_tallies(stream, counts):
            if isinstance(item, DecodeTally):
                table.merge(item)
            else:
                table.add(item)
    return analyze_table(table, counts, max_graph)


def analyze_table(
    table: DecodeTable, counts: ScanCounts, max_graph: int | None = None
) -> JournalReport:
    sawtooth = find_sawtooth(table)
    # The falls mark captured sizes; so does a stated max (an inferred one may sit below it).
    stated = {max_graph} if max_graph else set()
    buckets = sorted({d.boundary for d in sawtooth} | stated) if sawtooth else []
    max_graph = max_graph if max_graph is not None else table.max_graph_running
    return JournalReport(
        table=table,
        counts=counts,
        max_graph=max_graph,
        sawtooth=sawtooth,
        buckets=buckets,
        law=step_time_law(table, buckets),
        overflow=eager_overflow(table, max_graph),
        recommended=recommend_buckets(table, max_graph),
        prefill_law=prefill_law(table.prefill),
    )


def fmt_num(value: float | None, digits: int = 1) -> str:
    """Thousands separators, fixed digits, `-` for a missing value (tables of both commands)."""
    return "-" if value is None else f"{value:,.{digits}f}"


def render(report: JournalReport, console: Console) -> None:
    if report.table.rows:  # a prefill journal has none
        console.print(_decode_table(report))
    _print_counts(report, console)
    _print_prefill(report, console)
    _print_decode_findings(report, console)


def _decode_table(report: JournalReport) -> Table:
    """Decode throughput per running-request count, sawtooth drops marked ▼."""
    t = report.table
    spec = t.accept_len is not None
    table = Table(
        title="Decode throughput by running requests" + (" (speculative decoding)" if spec else ""),
        title_justify="left",
    )
    columns = ["running", "lines", "mean gen tok/s", "tok/s per req", "step ms", "eager"]
    if spec:
        columns.insert(4, "accept len")
    for col in columns:
        table.add_column(col, justify="right")
    marks = {d.boundary for d in report.sawtooth}
    for r in t.sorted_rows():
        step = r.graph_step_ms if r.graph_step_ms is not None else r.eager_step_ms
        cells = [
            f"{r.running}{' ▼' if r.running in marks else ''}",
            str(r.lines),
            fmt_num(r.mean_tps),
            fmt_num(r.tps_per_request, 2),
            fmt_num(step),
            f"[red]{r.eager_lines}[/red]" if r.eager_lines else "0",
        ]
        if spec:
            cells.insert(4, fmt_num(r.mean_accept_len, 2))
        table.add_row(*cells)
    return table


def _print_counts(report: JournalReport, console: Console) -> None:
    t, c = report.table, report.counts
    console.print(
        f"{c.lines:,} lines, {t.decode_lines:,} decode, {t.prefill.lines:,} prefill, "
        f"{c.unparseable:,} unparseable"
        + (
            f", {c.out_of_range:,} outside the window, {c.untimed:,} untimed"
            if c.out_of_range or c.untimed
            else ""
        )
    )


def _print_prefill(report: JournalReport, console: Console) -> None:
    """Prefill totals and batch-time law, the engine's flags, and a hint when the log has
    no batch lines at all."""
    t = report.table
    if (p := t.prefill).lines:
        seen = p.new_tokens + p.cached_tokens
        hit = f"{100 * p.cached_tokens / seen:.1f}%" if seen else "-"
        console.print(
            f"Prefill: {p.new_tokens:,} new tokens, {p.cached_tokens:,} cached ({hit} hit), "
            f"mean input {fmt_num(p.mean_input_tps)} tok/s, longest queue {p.max_queue}"
        )
    if p.health_checks:
        console.print(f"Left out: {p.health_checks:,} health-check batches (one-token /health)")
    if (pf := report.prefill_law) is not None:
        console.print(
            f"Prefill batch time: [bold]{pf.a:.2f} ms + {pf.b:.4f} ms x new tokens[/bold] "
            f"(R² {pf.r2:.3f}, {t.prefill.busy_lines:,} back-to-back batches, "
            f"{pf.points} sizes); ceiling {fmt_num(pf.asymptote_tps)} "
            "tok/s"
        )
    if t.flags:
        console.print("Engine flags: " + ", ".join(f"{k}={v}" for k, v in sorted(t.flags.items())))
    if not t.decode_lines and not t.prefill.lines:
        console.print(
            "[yellow]No `Decode batch` or `Prefill batch` lines: is this an SGLang engine's "
            "log (scheduler lines need --log-level info)?[/yellow]"
        )


def _print_decode_findings(report: JournalReport, console: Console) -> None:
    """Speculative decoding's accept length, the decode step-time law, graph-bucket sawtooth,
    eager overflow and the buckets to capture."""
    if (accept := report.table.accept_len) is not None:
        console.print(
            f"Speculative decoding: mean accept len {accept:.2f} tokens per request per "
            "step; step ms = 1000 x running x accept len / tok/s, per draft-and-verify step"
        )
    if (law := report.law) is not None:
        f = law.fit
        per = "per speculative step, " if law.accept_len else ""
        at = f" at accept len {law.accept_len:.2f}" if law.accept_len else ""
        console.print(
            f"Step time: [bold]{f.a:.2f} ms + {f.b:.3f} ms x batch[/bold] "
            f"({per}R² {f.r2:.3f}, fitted at {law.basis}); "
            f"asymptote {fmt_num(law.asymptote_tps)} tok/s{at}"
        )
    if report.sawtooth:
        drops = ", ".join(
            f"{d.boundary}→{d.boundary + 1} -{d.drop_pct:.1f}%" for d in report.sawtooth
        )
        console.print(f"[yellow]Graph-bucket sawtooth[/yellow] (▼): {drops}")
    if report.overflow is not None:
        o = report.overflow
        console.print(
            f"[red]Eager overflow:[/red] {o.lines:,} decode lines ran eager above the largest "
            f"graph ({o.max_graph}), batches up to {o.largest_batch}: raise "
            f"--cuda-graph-max-bs-decode (eager steps allocate temporaries and can OOM)"
        )
    if report.recommended:
        console.print(
            "Recommended: --cuda-graph-bs-decode " + " ".join(map(str, report.recommended))
        )
