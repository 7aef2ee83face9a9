"""How the ops commands print what a restart did and warn: shared by `restart`, `recover` and
`finish`, in a module of its own so that `recover` (started by systemd after every engine
crash, its start-up part of the time to serving again) imports click and nothing more here."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pdctl.ops.report import Report


def warn(line: str) -> None:
    click.secho(line, fg="yellow", err=True)


def print_reports(reports: list[Report], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps([asdict(r) for r in reports], indent=2))
        return
    for r in reports:
        for line in r.lines:
            click.secho(line, fg="green" if line.startswith("OK") else "red")
        if not r.ok:
            click.secho(f"{r.target}: {r.error}", fg="red", err=True)
            for unit, lines in r.journal.items():
                click.echo(f"--- journalctl -u {unit} (last {len(lines)} lines)", err=True)
                for line in lines:
                    click.echo(f"  {line}", err=True)
