"""`pdctl capacity`: how many prefills and decodes, with which limits and graph buckets."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from pdctl.bench.level import parse_int_list
from pdctl.capacity.laws import Laws, load_laws
from pdctl.capacity.prefill import Handoff, Policy
from pdctl.capacity.report import as_dict, layout_snippet, render
from pdctl.capacity.search import Engines, Shape, Targets, plan
from pdctl.capacity.workload import workload
from pdctl.cli.options import format_option
from pdctl.errors import PdctlError

DEFAULT_CHUNK = 8192  # SGLang's --chunked-prefill-size on GPUs of 90 GiB and more


def _context(laws: Laws, given: int | None) -> tuple[int | None, str]:
    if given is not None:
        return given, "--context-length"
    for flags, source in ((laws.decode_flags, laws.decode_source),
                          (laws.prefill_flags, laws.prefill_source)):  # fmt: skip
        if isinstance(value := flags.get("context_length"), int):
            return value, f"{source}'s engine flags"
    return None, ""


def _chunk(laws: Laws, given: int | None) -> tuple[int, str | None]:
    """The prefill's batch budget and, when it is a guess, the warning that says so."""
    if given is not None:
        return given, None
    if isinstance(value := laws.prefill_flags.get("chunked_prefill_size"), int) and value > 0:
        return value, None
    return DEFAULT_CHUNK, (
        f"the prefill law ({laws.prefill_source}) does not say its chunked_prefill_size: "
        f"{DEFAULT_CHUNK} assumed (--chunked-prefill-size)"
    )


def _kv_pool(laws: Laws, given: int | None) -> tuple[int | None, str]:
    if given is not None:
        return given, "--kv-pool-tokens"
    if isinstance(value := laws.decode_flags.get("max_total_num_tokens"), int) and value > 0:
        return value, f"{laws.decode_source}'s engine flags"
    return None, ""


def _handoff(fixed_ms: float, kv_bytes: int | None, link_gb_s: float | None) -> Handoff:
    if (kv_bytes is None) != (link_gb_s is None):
        raise PdctlError("give --kv-bytes-per-token and --kv-link-gb-s together")
    return Handoff.of(fixed_ms, kv_bytes or 0, link_gb_s)


def _targets(values: dict[float, float | None]) -> dict[float, float]:
    return {q: t for q, t in values.items() if t is not None}


@click.command()
@click.argument("laws", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--rate", type=float,
    help="Requests per second (Poisson arrivals; default: a --trace's arrivals).",
)  # fmt: skip
@click.option("--input-len", type=click.IntRange(min=1), help="Input tokens per request.")
@click.option("--output-len", type=click.IntRange(min=1), help="Output tokens per request.")
@click.option(
    "--lengths-from",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A bench result file: its last run's length distribution instead of fixed lengths.",
)
@click.option(
    "--trace",
    type=click.Path(path_type=Path, dir_okay=False),
    help='JSON lines {"input_len", "output_len"[, "arrival_s"]}: the lengths (and the rate).',
)
@click.option(
    "--ttft-p90-ms", type=click.FloatRange(min=0, min_open=True), required=True,
    help="Target time to first token, 90th percentile.",
)  # fmt: skip
@click.option(
    "--itl-p90-ms", type=click.FloatRange(min=0, min_open=True), required=True,
    help="Target inter-token latency, 90th percentile (caps a decode's running requests).",
)  # fmt: skip
@click.option("--ttft-p99-ms", type=click.FloatRange(min=0, min_open=True), help="Optional.")
@click.option("--itl-p99-ms", type=click.FloatRange(min=0, min_open=True), help="Optional.")
@click.option("--gpu-budget", type=click.IntRange(min=1), help="At most this many GPUs.")
@click.option("--gpus-per-prefill", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--gpus-per-decode", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--gpus-per-host", type=click.IntRange(min=1), default=8, show_default=True,
    help="For the layout snippet: GPUs per host, split over 2 NUMA nodes.",
)  # fmt: skip
@click.option(
    "--cuda-graph-bs",
    help="Fixed decode graph buckets, comma-separated (default: the planner chooses).",
)
@click.option(
    "--context-length",
    type=click.IntRange(min=1),
    help="Longest request allowed (default: the laws' engine flags, when they name it).",
)
@click.option(
    "--chunked-prefill-size", type=click.IntRange(min=1),
    help="Prompt tokens one prefill batch takes (default: the prefill law's engine flags).",
)  # fmt: skip
@click.option(
    "--handoff-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
    help="Fixed PD handoff per request: TTFT at idle minus the prefill law (docs/bench.md).",
)  # fmt: skip
@click.option(
    "--kv-bytes-per-token", type=click.IntRange(min=1),
    help="KV bytes per prompt token moved to the decode (the profile's model.kv_bytes_per_token).",
)  # fmt: skip
@click.option(
    "--kv-link-gb-s",
    type=click.FloatRange(min=0, min_open=True),
    help="KV transfer bandwidth between prefill and decode, GB/s.",
)
@click.option(
    "--router-policy", type=click.Choice(["round_robin", "random"]), default="round_robin",
    show_default=True,
    help="How the gateway deals requests to prefills (random: also the bound for load-aware ones).",
)  # fmt: skip
@click.option(
    "--kv-pool-tokens", type=click.IntRange(min=1),
    help="A decode's KV pool in tokens (`pdctl plan`'s KV pool; default: the decode law's "
    "max_total_num_tokens): max_running_requests holds at most pool / (input + output).",
)  # fmt: skip
@format_option
def capacity(
    laws: tuple[Path, ...],
    rate: float | None,
    input_len: int | None,
    output_len: int | None,
    lengths_from: Path | None,
    trace: Path | None,
    ttft_p90_ms: float,
    itl_p90_ms: float,
    ttft_p99_ms: float | None,
    itl_p99_ms: float | None,
    gpu_budget: int | None,
    gpus_per_prefill: int,
    gpus_per_decode: int,
    gpus_per_host: int,
    cuda_graph_bs: str | None,
    context_length: int | None,
    chunked_prefill_size: int | None,
    handoff_ms: float,
    kv_bytes_per_token: int | None,
    kv_link_gb_s: float | None,
    router_policy: Policy,
    kv_pool_tokens: int | None,
    fmt: str,
) -> None:
    """Engine counts, decode limits and graph buckets for a workload and its latency targets.

    LAWS are `pdctl analyze journal --format json` outputs of a decode journal and a prefill
    journal (or one file holding both). A decode's step at its padded batch is its ITL, so
    the ITL target caps its running requests, lower with coarse buckets than with fine ones;
    TTFT is a prefill's batching queue over the prefill law plus the PD handoff (docs/bench.md,
    "pdctl capacity").

    \b
    Example:
      pdctl analyze journal -u pdstack-pd0-decode.service --format json > decode.json
      pdctl analyze journal -u pdstack-pd0-prefill.service --format json > prefill.json
      pdctl capacity decode.json prefill.json --rate 4 --input-len 2048 --output-len 256 \\
          --ttft-p90-ms 1000 --itl-p90-ms 50
    """
    found = load_laws(laws)
    context, context_source = _context(found, context_length)
    load = workload(rate, input_len, output_len, lengths_from, context, context_source, trace)
    targets = Targets(
        _targets({0.9: ttft_p90_ms, 0.99: ttft_p99_ms}),
        _targets({0.9: itl_p90_ms, 0.99: itl_p99_ms}),
    )
    shape = Shape(gpus_per_prefill, gpus_per_decode, gpu_budget)
    given = parse_int_list(cuda_graph_bs, "--cuda-graph-bs") if cuda_graph_bs else None
    chunk, chunk_warning = _chunk(found, chunked_prefill_size)
    handoff = _handoff(handoff_ms, kv_bytes_per_token, kv_link_gb_s)
    engines = Engines(chunk, handoff, router_policy, *_kv_pool(found, kv_pool_tokens))
    result = plan(found, load, targets, shape, given, engines)
    if chunk_warning:
        result.warnings.append(chunk_warning)
    layout = layout_snippet(result.recommended, shape, gpus_per_host)
    if fmt == "json":
        click.echo(json.dumps(as_dict(result, layout, load, targets, engines), indent=2))
    else:
        render(result, layout, targets, Console())
