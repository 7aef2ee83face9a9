"""`pdctl analyze`: read what the engines already logged; nothing here sends a request."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from pdctl.analyze.logparse import TimeWindow
from pdctl.analyze.report import analyze_stream, render
from pdctl.analyze.sources import file_window, open_file, open_journal
from pdctl.cli.options import format_option


def new_file(_: click.Context, __: click.Parameter, value: Path | None) -> Path | None:
    """Option callback for an output file: its directory must exist before the work starts
    (a plot that cannot be written should not cost a multi-GB read, or a benchmark run)."""
    if value is not None and not value.resolve().parent.is_dir():
        raise click.BadParameter(f"{value.parent} is not a directory")
    return value


@click.group()
def analyze() -> None:
    """Analyse what the engines logged: decode scaling, step-time law, CUDA-graph buckets.

    \b
    Example:
      pdctl analyze journal -u pdstack-pd0-decode.service --since -1d --plot decode.png
    """


@analyze.command()
@click.option("-u", "--unit", help="systemd unit to read with `journalctl -u UNIT -o cat`.")
@click.option("-H", "--host", help="Run journalctl on this host over ssh (with -u).")
@click.option(
    "--file",
    "path",
    help="A saved log instead: plain or gzip, journalctl -o cat/short text; - for stdin.",
)
@click.option("--since", help="Start of the window (journalctl syntax with -u; ISO with --file).")
@click.option("--until", help="End of the window (same forms as --since).")
@click.option(
    "--graph-max-bs",
    type=click.IntRange(min=1),
    help="The decode server's largest CUDA graph (default: largest batch seen in a graph).",
)
@format_option
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=new_file,
    help="Write a PNG plot here.",
)
def journal(
    unit: str | None,
    host: str | None,
    path: str | None,
    since: str | None,
    until: str | None,
    graph_max_bs: int | None,
    fmt: str,
    plot: Path | None,
) -> None:
    """Decode scaling from `Decode batch` log lines: table, step-time law, graph buckets.

    Per number of running requests: log lines, mean generated tok/s, tok/s per request and
    how many lines ran eager. Then the step-time fit ms = a + b x batch with its throughput
    ceiling 1000/b, the CUDA-graph bucket sawtooth (tok/s falling as the batch crosses a
    bucket), eager batches above the largest graph, and a --cuda-graph-bs-decode list that
    puts graphs where the batches are. The input is streamed: multi-GB journals are fine.

    \b
    Examples:
      pdctl analyze journal -u pdstack-pd0-decode.service --since -1d
      pdctl analyze journal -u pdstack-pd0-decode.service -H gpu1 --plot decode.png
      pdctl analyze journal --file decode.log.gz --format json
      journalctl -u pdstack-pd0-decode -o cat | pdctl analyze journal --file -
    """
    if (unit is None) == (path is None):
        raise click.UsageError("give exactly one of -u/--unit and --file")
    if host and not unit:
        raise click.UsageError("-H/--host goes with -u/--unit")
    if unit:
        # journalctl applies --since/--until itself, in any syntax it knows.
        with open_journal(unit, host, since, until) as stream:
            report = analyze_stream(stream, TimeWindow(), graph_max_bs)
    else:
        assert path is not None
        window = file_window(since, until)
        with open_file(path) as stream:
            report = analyze_stream(stream, window, graph_max_bs)
    if plot is not None:
        from pdctl.analyze.plot import plot_journal  # matplotlib only when a plot is asked for

        plot_journal(report, plot)
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        render(report, Console())
    if plot is not None and fmt != "json":
        click.echo(f"plot: {plot}")
