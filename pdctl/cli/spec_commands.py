"""Commands over the deployment spec: nothing here touches a host."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from pdctl.cli.options import deployment_options, format_option, instance_option
from pdctl.errors import PdctlError
from pdctl.lint import Finding, lint, report
from pdctl.plan import TIGHT_MARGIN_GIB, InstancePlan, Verdict, plan_instance
from pdctl.render import render_instance, router_args
from pdctl.spec import Deployment, Instance, load_deployment


def _select(dep: Deployment, only: tuple[str, ...]) -> list[Instance]:
    instances = dep.instances
    if not only:
        return instances
    known = {i.id for i in instances} | {i.name for i in instances}
    unknown = sorted(set(only) - known)
    if unknown:
        raise click.BadParameter(
            f"unknown instance {', '.join(unknown)}; valid: {', '.join(sorted(known))}",
            param_hint="--instance",
        )
    return [i for i in instances if i.id in only or i.name in only]


@click.command()
@deployment_options
@format_option
@instance_option
def render(inventory: Path, profile: Path | None, fmt: str, only: tuple[str, ...]) -> None:
    """Print each instance's exact command line, environment and systemd unit.

    These are the lines site.yml installs: the same functions render both.
    """
    dep = load_deployment(inventory, profile)
    rendered = [render_instance(i, dep) for i in _select(dep, only)]
    if fmt == "json":
        out = {
            "instances": [
                {
                    "id": r.instance.id,
                    "unit": r.instance.unit,
                    "command": r.command,
                    "environment": r.environment,
                    "env_file": r.env_file,
                    "env_file_text": r.env_text,
                    "unit_file": r.unit,
                }
                for r in rendered
            ],
            # Every [router] host runs the gateway with these arguments.
            "gateway": {"hosts": [g.name for g in dep.gateways], "args": router_args(dep)},
        }
        click.echo(json.dumps(out, indent=2))
        return
    for r in rendered:
        click.secho(f"# {r.instance.id} -> {r.instance.unit}", bold=True)
        click.echo(f"## environment ({r.env_file})")
        click.echo(r.env_text)
        click.echo("## unit")
        click.echo(r.unit)
    click.secho(f"# gateway on {', '.join(g.name for g in dep.gateways)}", bold=True)
    click.echo(shlex.join(["smg", *router_args(dep)]))


@click.command()
@deployment_options
@format_option
@click.option("--strict", is_flag=True, help="Fail (exit 1) on warnings too, e.g. in CI.")
@click.option(
    "--target-version",
    metavar="VERSION",
    help="Also check the launch flags and the monitoring pack against this sglang version, "
    "before a rollout moves to it (a version pdctl ships lists for).",
)
@click.option(
    "--monitoring",
    "pack",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("monitoring"),
    show_default=True,
    help="The monitoring pack --target-version checks: DIR/rules/*.yml and "
    "DIR/dashboards/**/*.json (python -m monitoring.build --out DIR, or the committed build); "
    "refused without --target-version.",
)
def validate(
    inventory: Path,
    profile: Path | None,
    fmt: str,
    strict: bool,
    target_version: str | None,
    pack: Path,
) -> None:
    """Lint the deployment for the pitfalls that broke PD serving before.

    Reads the inventory and the profile, then checks the layout (GPUs, TP, NUMA, ports), that
    the prefills and decodes of each group agree on their KV handover (and, with several pairs,
    that the gateway keeps requests inside pairs), CUDA-graph sizes against max running
    requests, the per-GPU memory budget (see `pdctl plan`), RDMA NIC settings, every launch
    flag against the pinned sglang's own parser, and model-family pitfalls. Each finding says
    what breaks and which profile key to change.

    With --target-version, also every launch flag against that version's parser (a removed or
    renamed flag is an error naming the closest option) and every sglang:* series the pack's
    rules (error) and dashboards (warning) read against the families it emits. Input that
    cannot be read (inventory, profile, a file of the pack) is one line, or with --format json
    one object {"error", "exit_code", ...} on stdout.

    \b
    Exit codes:
      0  no errors (warnings are printed but pass)
      1  warnings only, and --strict was given
      2  errors, unreadable input, no lists for --target-version, or --monitoring without it
    \b
    Examples:
      pdctl validate
      pdctl validate -p deploy/profiles/sim.yml --strict
      pdctl validate --target-version 0.5.17
      pdctl validate --format json | jq '.findings[].id'
    """
    try:
        dep, findings = _validated(inventory, profile, target_version, pack)
    except PdctlError as e:
        if fmt != "json":
            raise
        # Scripts read stdout as JSON whatever happened: the error as an object, not a line.
        error = {"error": str(e), "exit_code": e.exit_code}
        click.echo(json.dumps(_sources(inventory, profile, target_version) | error, indent=2))
        sys.exit(e.exit_code)
    counts = report.summary(dep, findings, strict)
    code = counts["exit_code"]
    if fmt == "json":
        out = {
            **_sources(dep.inventory_path, dep.profile_path, target_version),
            "findings": [asdict(f) for f in findings],
            "summary": counts,
        }
        click.echo(json.dumps(out, indent=2))
    else:
        report.print_findings(dep, findings, counts, Console())
    sys.exit(code)


def _validated(
    inventory: Path, profile: Path | None, target_version: str | None, pack: Path
) -> tuple[Deployment, list[Finding]]:
    """The deployment and its findings; PdctlError for input that cannot be read, and for
    --monitoring without --target-version (the pack would silently go unchecked)."""
    ctx = click.get_current_context()
    if target_version is None and ctx.get_parameter_source("pack") is not ParameterSource.DEFAULT:
        raise PdctlError(
            "--monitoring names the pack --target-version checks: give --target-version "
            "VERSION too, or leave --monitoring out"
        )
    dep = load_deployment(inventory, profile)
    findings = lint(dep)
    if target_version is not None:
        from pdctl.lint.target import check_target  # only here: plain validate stays light

        findings += check_target(dep, target_version, pack)
    return dep, findings


def _sources(inventory: Path, profile: Path | None, target_version: str | None) -> dict[str, Any]:
    """What validate's JSON says it read: the same keys for findings and for an error."""
    return {
        "inventory": str(inventory),
        "profile": None if profile is None else str(profile),
        "target_version": target_version,
    }


@click.command()
@deployment_options
@format_option
@instance_option
@click.option(
    "--mem-fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="What-if: this --mem-fraction-static instead of the profile's.",
)
@click.option(
    "--graph-max-bs",
    type=click.IntRange(min=0),
    help="What-if: this largest CUDA-graph batch (0 = no graphs); aim it with --instance.",
)
@click.option(
    "--gpu-memory-mib",
    type=click.IntRange(min=1),
    help="What-if: GPU memory (as nvidia-smi shows).",
)
@click.option(
    "--weights-gib", type=click.FloatRange(min=0, min_open=True), help="What-if: weights per GPU."
)
@click.option("--kv-bytes-per-token", type=click.IntRange(min=1), help="What-if: per GPU.")
def plan(
    inventory: Path,
    profile: Path | None,
    fmt: str,
    only: tuple[str, ...],
    mem_fraction: float | None,
    graph_max_bs: int | None,
    gpu_memory_mib: int | None,
    weights_gib: float | None,
    kv_bytes_per_token: int | None,
) -> None:
    """Per-GPU memory budget of each instance: will the KV pool and the CUDA graphs fit?

    \b
    static pool  = mem_fraction_static x GPU memory    (weights + KV pool)
    KV pool      = static pool - weights               (/ KV bytes per token = tokens)
    outside      = GPU memory - static pool
    needed       = runtime overhead + activation peak + graph GiB per batch x graph max bs
    headroom     = outside - needed: < 0 OOMs at graph capture, < 1 GiB is tight

    Calibration (profile key planner) reproduces the seed's history: 0.85 with graphs to 32
    OOMed, 0.70 with 32 and 0.60 with 64 or 96 ran. Also printed: the largest fraction that
    is safe for the instance's graph batch, and the largest graph batch safe at its fraction.
    The what-if options change the plan, never the profile.

    \b
    Exit codes: 0 every budget fits (maybe tight), 2 one does not, or bad input.
    \b
    Examples:
      pdctl plan
      pdctl plan --instance pd0-decode --mem-fraction 0.85 --graph-max-bs 32
      pdctl plan --format json
    """
    dep = load_deployment(inventory, profile)
    plans = [
        plan_instance(
            inst,
            dep,
            mem_fraction=mem_fraction,
            graph_bs=graph_max_bs,
            gpu_memory_mib=gpu_memory_mib,
            weights_gib=weights_gib,
            kv_bytes_per_token=kv_bytes_per_token,
        )
        for inst in _select(dep, only)
    ]
    if fmt == "json":
        click.echo(json.dumps({"instances": [_plan_json(p) for p in plans]}, indent=2))
    else:
        console = Console()
        for p in plans:
            console.print(_plan_table(p))
    sys.exit(2 if any(p.fails for p in plans) else 0)


def _plan_json(p: InstancePlan) -> dict[str, object]:
    return {
        "id": p.instance.id,
        "gpu": asdict(p.gpu),
        "graph_bs": p.graph_bs,
        "budget": None
        if p.budget is None
        else {k: v for k, v in asdict(p.budget).items() if k not in ("gpu", "graph_bs")},
        "tight_margin_gib": TIGHT_MARGIN_GIB,
        "max_safe_fraction": p.max_safe_fraction,
        "max_safe_graph_bs": p.max_safe_graph_bs,
    }


VERDICT_STYLE = {
    Verdict.FITS: "green",
    Verdict.TIGHT: "yellow",
    Verdict.GRAPH_OOM: "red",
    Verdict.NO_KV_POOL: "red",
}


def _plan_table(p: InstancePlan) -> Table:
    g, b = p.gpu, p.budget
    table = Table("GiB per GPU", "", title=f"{p.instance.id}", title_justify="left")
    table.columns[1].justify = "right"
    table.add_row("GPU memory", f"{g.gpu_gib:.1f}")
    if b is None:
        table.add_row("verdict", "[yellow]unknown: mem_fraction_static unset[/]")
    else:
        context = f" = {b.sequences:.1f} x {g.context_length} context" if b.sequences else ""
        table.add_row(f"static pool ({b.mem_fraction:g} x GPU)", f"{b.static_gib:.1f}")
        table.add_row("  weights", f"{g.weights_gib:.1f}")
        table.add_row(f"  KV pool ({b.kv_tokens:,} tokens{context})", f"{b.kv_pool_gib:.1f}")
        table.add_row("outside the static pool", f"{b.outside_gib:.1f}")
        table.add_row("  runtime overhead (CUDA context, NCCL)", f"{g.runtime_overhead_gib:.1f}")
        table.add_row("  activation peak", f"{g.activation_peak_gib:.1f}")
        table.add_row(
            f"  CUDA graphs ({p.graph_bs} x {g.graph_gib_per_batch:g})",
            f"{g.graph_pool_gib(p.graph_bs):.1f}",
        )
        table.add_row("  needed", f"{b.needed_outside_gib:.1f}")
        table.add_row(f"headroom (tight below {TIGHT_MARGIN_GIB:g})", f"{b.headroom_gib:.2f}")
        style = VERDICT_STYLE[b.verdict]
        table.add_row("verdict", f"[{style}]{b.verdict}[/]")
    table.add_row(f"max safe mem fraction at graph bs {p.graph_bs}", _or_none(p.max_safe_fraction))
    if b is not None:
        table.add_row(
            f"max safe graph bs at fraction {b.mem_fraction:g}", _or_none(p.max_safe_graph_bs)
        )
    return table


def _or_none(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"
