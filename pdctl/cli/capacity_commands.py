"""`pdctl capacity`: how many prefills and decodes, with which limits and graph buckets."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from pdctl.bench.level import parse_int_list
from pdctl.capacity.laws import Laws, load_laws
from pdctl.capacity.prefill import Handoff, Policy
from pdctl.capacity.profile import Deployed, load_deployed, profile_warnings
from pdctl.capacity.report import Site, as_dict, layout_snippet, render
from pdctl.capacity.search import Engines, Shape, Targets, plan
from pdctl.capacity.workload import workload
from pdctl.cli.options import deprecated, format_option, former_name
from pdctl.errors import PdctlError
from pdctl.spec import Role

DEFAULT_CHUNK = 8192  # SGLang's --chunked-prefill-size on GPUs of 90 GiB and more
DEFAULT_GPUS = 4  # per engine, without --profile
PROFILE_BUCKETS = "profile"  # --cuda-graph-bs profile: keep the profile's decode buckets


def _context(laws: Laws, given: int | None, deployed: Deployed | None) -> tuple[int | None, str]:
    if given is not None:
        return given, "--context-length"
    if deployed is not None and (value := deployed.context_length) is not None:
        return value, f"{deployed.path}'s context_length"
    for flags, source in ((laws.decode_flags, laws.decode_source),
                          (laws.prefill_flags, laws.prefill_source)):  # fmt: skip
        if isinstance(value := flags.get("context_length"), int):
            return value, f"{source}'s engine flags"
    return None, ""


def _chunk(laws: Laws, given: int | None, deployed: Deployed | None) -> tuple[int, str | None]:
    """The prefill's batch budget and, when it is a guess, the warning that says so."""
    if given is not None:
        return given, None
    if deployed is not None and (value := deployed.chunked_prefill_size) is not None:
        return value, None
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


def _handoff(
    fixed_ms: float, kv_bytes: int | None, link_gb_s: float | None, deployed: Deployed | None
) -> Handoff:
    """KV bytes per token: the option, else the profile's model.kv_bytes_per_token, which
    only a link speed puts to use."""
    if link_gb_s is not None and kv_bytes is None and deployed is not None:
        kv_bytes = deployed.profile.model.kv_bytes_per_token
    if (kv_bytes is None) != (link_gb_s is None):
        raise PdctlError("give --kv-bytes-per-token and --kv-link-gb-s together")
    return Handoff.of(fixed_ms, kv_bytes or 0, link_gb_s)


def _gpus(given: int | None, role: Role, deployed: Deployed | None) -> int:
    if given is not None:
        return given
    return DEFAULT_GPUS if deployed is None else deployed.gpus(role)


def _buckets(given: str | None, deployed: Deployed | None) -> list[int] | None:
    if given is None:
        return None
    if given != PROFILE_BUCKETS:
        return parse_int_list(given, "--cuda-graph-bs")
    if deployed is None:
        raise PdctlError(f"--cuda-graph-bs {PROFILE_BUCKETS} keeps --profile's buckets: give it")
    if deployed.cuda_graph_bs is None:
        raise PdctlError(
            f"--cuda-graph-bs {PROFILE_BUCKETS}: {deployed.path} sets no decode cuda_graph_bs"
        )
    return deployed.cuda_graph_bs


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
@click.option(
    "-p", "--profile", type=click.Path(path_type=Path, dir_okay=False),
    help="The deployment profile to plan for: warns where a law's engine flags differ from "
    "the profile's for its role, and gives the defaults that say (from the profile) below.",
)  # fmt: skip
@click.option(
    "--gpus-per-prefill", type=click.IntRange(min=1),
    help=f"GPUs of a prefill engine (default: from the profile, else {DEFAULT_GPUS}).",
)  # fmt: skip
@click.option(
    "--gpus-per-decode", type=click.IntRange(min=1),
    help=f"GPUs of a decode engine (default: from the profile, else {DEFAULT_GPUS}).",
)  # fmt: skip
@click.option(
    "--gpus-per-host", type=click.IntRange(min=1),
    help="For the layout snippet: GPUs per host (default: from the profile, else 8, split "
    "over 2 NUMA nodes).",
)  # fmt: skip
@click.option(
    "--cuda-graph-bs",
    help="Fixed decode graph buckets, comma-separated, or `profile` for the profile's "
    "(default: the planner chooses).",
)
@click.option(
    "--context-length",
    type=click.IntRange(min=1),
    help="Longest request allowed (default: from the profile, else the laws' engine flags).",
)
@click.option(
    "--chunked-prefill-size", type=click.IntRange(min=1),
    help="Prompt tokens one prefill batch takes (default: from the profile, else the prefill "
    "law's engine flags).",
)  # fmt: skip
@click.option(
    "--handoff-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
    help="Fixed PD handoff per request: TTFT at idle minus the prefill law (docs/bench.md).",
)  # fmt: skip
@click.option(
    "--kv-bytes-per-token", type=click.IntRange(min=1),
    help="KV bytes per prompt token on one decode GPU, which each TP rank receives in "
    "parallel (default with --kv-link-gb-s: from the profile, model.kv_bytes_per_token).",
)  # fmt: skip
@click.option(
    "--kv-link-gb-s",
    type=click.FloatRange(min=0, min_open=True),
    help="KV transfer bandwidth of one TP rank's path from prefill to decode, GB/s (ranks "
    "that share one link: its bandwidth / TP size).",
)
@click.option(
    "--gateway-policy", type=click.Choice(["round_robin", "random"]), default="round_robin",
    show_default=True,
    help="How the gateway deals requests to prefills (random: also the bound for load-aware ones).",
)  # fmt: skip
@former_name("--router-policy", "--gateway-policy", type=click.Choice(["round_robin", "random"]))
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
    profile: Path | None,
    gpus_per_prefill: int | None,
    gpus_per_decode: int | None,
    gpus_per_host: int | None,
    cuda_graph_bs: str | None,
    context_length: int | None,
    chunked_prefill_size: int | None,
    handoff_ms: float,
    kv_bytes_per_token: int | None,
    kv_link_gb_s: float | None,
    gateway_policy: Policy,
    router_policy: Policy | None,
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
          --ttft-p90-ms 1000 --itl-p90-ms 50 [--profile deploy/profiles/reference.yml]
    """
    if router_policy is not None:
        deprecated("--router-policy", "--gateway-policy")
        gateway_policy = router_policy
    found = load_laws(laws)
    deployed = load_deployed(profile) if profile is not None else None
    context, context_source = _context(found, context_length, deployed)
    load = workload(rate, input_len, output_len, lengths_from, context, context_source, trace)
    targets = Targets(
        _targets({0.9: ttft_p90_ms, 0.99: ttft_p99_ms}),
        _targets({0.9: itl_p90_ms, 0.99: itl_p99_ms}),
    )
    gpus = {
        Role.PREFILL: _gpus(gpus_per_prefill, Role.PREFILL, deployed),
        Role.DECODE: _gpus(gpus_per_decode, Role.DECODE, deployed),
    }
    shape = Shape(gpus[Role.PREFILL], gpus[Role.DECODE], gpu_budget)
    given = _buckets(cuda_graph_bs, deployed)
    chunk, chunk_warning = _chunk(found, chunked_prefill_size, deployed)
    handoff = _handoff(handoff_ms, kv_bytes_per_token, kv_link_gb_s, deployed)
    engines = Engines(chunk, handoff, gateway_policy, *_kv_pool(found, kv_pool_tokens))
    result = plan(found, load, targets, shape, given, engines)
    if chunk_warning:
        result.warnings.append(chunk_warning)
    if deployed is None:
        site = Site(gpus_per_host) if gpus_per_host else Site()
    else:
        result.warnings += profile_warnings(found, deployed, gpus)
        site = deployed.site(gpus_per_host)
    layout = layout_snippet(result.recommended, shape, site)
    if fmt == "json":
        click.echo(json.dumps(as_dict(result, layout, load, targets, engines), indent=2))
    else:
        render(result, layout, targets, Console())
