"""Commands over the deployment spec: nothing here touches a host."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pdctl.cli.options import deployment_options, format_option
from pdctl.render import render_instance, router_args
from pdctl.spec import load_deployment


@click.command()
@deployment_options
@format_option
@click.option("--instance", "only", multiple=True, help="Only these instances (host/name or name).")
def render(inventory: Path, profile: Path | None, fmt: str, only: tuple[str, ...]) -> None:
    """Print each instance's exact command line, environment and systemd unit.

    These are the lines site.yml installs: the same functions render both.
    """
    dep = load_deployment(inventory, profile)
    instances = dep.instances
    if only:
        known = {i.id for i in instances} | {i.name for i in instances}
        unknown = sorted(set(only) - known)
        if unknown:
            raise click.BadParameter(
                f"unknown instance {', '.join(unknown)}; valid: {', '.join(sorted(known))}",
                param_hint="--instance",
            )
        instances = [i for i in instances if i.id in only or i.name in only]
    rendered = [render_instance(i, dep) for i in instances]
    if fmt == "json":
        out = {
            "instances": [
                {
                    "id": r.instance.id,
                    "unit": r.instance.unit,
                    "command": r.command,
                    "environment": r.environment,
                    "env_file": r.env_file,
                    "unit_file": r.unit,
                }
                for r in rendered
            ],
            "router": {"host": dep.router_host, "args": router_args(dep)},
        }
        click.echo(json.dumps(out, indent=2))
        return
    for r in rendered:
        click.secho(f"# {r.instance.id} -> {r.instance.unit}", bold=True)
        click.echo("## environment")
        click.echo("".join(f"{k}={v}\n" for k, v in r.environment.items()))
        click.echo("## unit")
        click.echo(r.unit)
    click.secho(f"# gateway on {dep.router_host}", bold=True)
    click.echo("smg " + " ".join(router_args(dep)))


COMMANDS = [render]
