"""`pdctl bench`: load the PD path and measure it the way sglang.bench_serving does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
from rich.console import Console

from pdctl.bench import results
from pdctl.bench.compare import as_dict, compare
from pdctl.bench.level import Target, build_levels
from pdctl.bench.view import RichProgress, compare_table, fit_line, sweep_table
from pdctl.cli.analyze_commands import new_file
from pdctl.cli.options import deployment_options, format_option
from pdctl.ops.gateway import KEY_FILES, KEY_VAR
from pdctl.ops.gateway import api_key as gateway_key
from pdctl.spec import Role, load_deployment


@click.group()
def bench() -> None:
    """Load the PD path and measure it like sglang.bench_serving; compare runs.

    \b
    Example (before and after a change):
      pdctl bench sweep --output-file before.jsonl --plot before.png
      pdctl bench sweep --output-file after.jsonl --plot after.png
      pdctl bench compare before.jsonl after.jsonl
    """


def sweep_target(
    url: str | None,
    metrics_urls: tuple[str, ...],
    inventory: Path,
    profile: Path | None,
    model: str | None,
    endpoint: str,
    api_key: str | None = None,
) -> Target:
    """Where requests go and which engine /metrics are sampled, from options or deployment."""
    if url is None:
        dep = load_deployment(inventory, profile)
        url = dep.client_url
        if not metrics_urls:
            metrics_urls = tuple(i.url + "/metrics" for i in dep.instances if i.role == Role.DECODE)
    elif not metrics_urls:
        metrics_urls = (url.rstrip("/") + "/metrics",)  # an engine answers; a gateway is skipped
    return Target(url.rstrip("/"), model or "", endpoint, metrics_urls, api_key or gateway_key())


@bench.command()
@deployment_options
@click.option("--url", help="Where requests go (default: the deployment's gateway).")
@click.option(
    "--concurrency", help="Closed-loop levels: requests in flight, comma-separated [1,16,64]."
)
@click.option(
    "--rate",
    help="Open-loop levels instead: requests/s, comma-separated; Poisson arrivals, no cap on "
    "requests in flight (bench_serving's --request-rate).",
)
@click.option("--input-len", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--range-ratio",
    type=click.FloatRange(0, 1),
    default=1.0,
    show_default=True,
    help="Lengths are drawn from [len*ratio, len] (bench_serving's --random-range-ratio; its "
    "default 0.0 draws from 1..len).",
)
@click.option(
    "--num-prompts",
    help="Prompts per level: one number or one per level (default 8 at C=1, else "
    "max(12·√C, 1.5·C): 48 at 16, 96 at 64; at a rate, 30 s of arrivals).",
)
@click.option(
    "--driver", type=click.Choice(["builtin", "sglang"]), default="builtin", show_default=True
)
@click.option("--model", help="Model name in requests (default: the first of /v1/models).")
@click.option(
    "--api-key",
    envvar=KEY_VAR,
    show_envvar=True,
    help=f"The gateway's API key, sent as Authorization: Bearer (default: {KEY_VAR} in "
    f"{' or '.join(map(str, KEY_FILES))} when readable). Prefer the variable: an option "
    "shows in `ps`.",
)
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=1800.0,
    show_default=True,
    help="Seconds per level before the sweep stops (completed levels are kept).",
)
@click.option(
    "--seed", type=int, default=1, show_default=True, help="Prompt seed (level i: seed+i)."
)
@click.option("--warmup-requests", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--metrics-url",
    "metrics_urls",
    multiple=True,
    help="Engine /metrics to sample while a level runs (repeatable; default: the "
    "deployment's decode engines, or URL/metrics with --url).",
)
@click.option(
    "--sglang-python",
    default="python3",
    show_default=True,
    help="Python of an SGLang venv (--driver sglang).",
)
@click.option("--sglang-args", default="", help="Extra bench_serving arguments (--driver sglang).")
@click.option(
    "--output-file",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=new_file,
    help="JSON lines, one per level (rewritten atomically after each level).",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=new_file,
    help="PNG: output tok/s and TPOT against concurrency.",
)
@format_option
def sweep(
    inventory: Path,
    profile: Path | None,
    url: str | None,
    concurrency: str | None,
    rate: str | None,
    input_len: int,
    output_len: int,
    range_ratio: float,
    num_prompts: str | None,
    driver: str,
    model: str | None,
    api_key: str | None,
    endpoint: str,
    timeout: float,
    seed: int,
    warmup_requests: int,
    metrics_urls: tuple[str, ...],
    sglang_python: str,
    sglang_args: str,
    output_file: Path | None,
    plot: Path | None,
    fmt: str,
) -> None:
    """Run a sweep: canary, then each level with a progress bar and a timeout.

    Each level sends its prompts with at most C requests in flight (or, with --rate, at
    Poisson arrival times: an open loop) and records
    bench_serving's fields (duration, completed, output_throughput, mean/median/p99
    TTFT, TPOT, ITL and e2e latency, max_concurrency, …) plus the engines' running
    requests, CUDA-graph state and KV usage sampled from /metrics meanwhile. At the end:
    a table and the fit TPOT = a + b·C, whose 1000/b tok/s is the decode ceiling.

    \b
    --driver builtin  an async streaming client in pdctl (no SGLang needed)
    --driver sglang   sglang's bench_serving from --sglang-python (GPU host); both
                      count failures by one rule (docs/bench.md, Failures)

    \b
    Examples:
      pdctl bench sweep --output-file before.jsonl --plot before.png
      pdctl bench sweep --url http://127.0.0.1:8000 --concurrency 1,8,32 --num-prompts 32
      pdctl bench sweep --rate 2,4,8 --input-len 1024 --output-len 256
      pdctl bench sweep --driver sglang --sglang-python /opt/pdstack/venv/bin/python \\
          --concurrency 64 --output-len 128
    """
    # aiohttp and numpy load here, not at `pdctl` start-up: other commands need neither.
    from pdctl.bench.sweep import SweepOptions, run_sweep

    levels = build_levels(concurrency, num_prompts, input_len, output_len, range_ratio, seed, rate)
    target = sweep_target(url, metrics_urls, inventory, profile, model, endpoint, api_key)
    opts = SweepOptions(driver, timeout, warmup_requests, 1.0, sglang_python, sglang_args)
    # With --format json the progress goes to stderr and stdout stays one JSON document.
    console = Console(stderr=fmt == "json")
    console.print(
        f"Sweep against {target.url}: canary, then {', '.join(lv.label for lv in levels)}"
    )
    with RichProgress(console) as progress:
        rows = asyncio.run(run_sweep(target, levels, opts, progress, output_file))
    fit = results.tpot_fit(rows)
    if plot is not None:
        from pdctl.bench.plot import plot_sweep  # matplotlib only when a plot is asked for

        plot_sweep(rows, fit, plot)
    if fmt == "json":
        summary = {"levels": rows, "tpot_fit": fit.as_dict() if fit else None}
        click.echo(json.dumps(summary, indent=2))
        return
    console.print(sweep_table(rows))
    console.print(fit_line(fit))
    for path, what in ((output_file, "results"), (plot, "plot")):
        if path is not None:
            console.print(f"{what}: {path}")


@bench.command(name="compare")
@click.argument("before", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("after", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@format_option
def compare_command(before: Path, after: Path, fmt: str) -> None:
    """Before/after per concurrency level, with deltas (green: better).

    Takes two `pdctl bench sweep --output-file` files or bench_serving --output-file files;
    a level present in only one side shows "-" on the other.

    \b
    Example:
      pdctl bench compare before.jsonl after.jsonl
    """
    rows_a, rows_b = results.load(before), results.load(after)
    levels = compare(rows_a, rows_b)
    fits = results.tpot_fit(rows_a), results.tpot_fit(rows_b)
    if fmt == "json":
        out = {
            "levels": as_dict(levels),
            "tpot_fit": {
                "before": fits[0].as_dict() if fits[0] else None,
                "after": fits[1].as_dict() if fits[1] else None,
            },
        }
        click.echo(json.dumps(out, indent=2))
        return
    console = Console()
    console.print(compare_table(levels, before.name, after.name))
    console.print(f"before: {fit_line(fits[0])}")
    console.print(f"after:  {fit_line(fits[1])}")
