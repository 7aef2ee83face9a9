"""`pdctl etcd`: the coordination store's controller-side chores (the TLS files)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group()
def etcd() -> None:
    """The coordination store (etcd on the inventory's [etcd] hosts)."""


@etcd.command("pki")
@click.option(
    "--dir",
    "pki_dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="The controller's PKI directory (holds the CA key; keep it off the hosts).",
)
@click.option(
    "--member",
    "members",
    multiple=True,
    metavar="NAME=ADDRESS",
    help="An [etcd] host and its address (repeat per member).",
)
@click.option(
    "--client", "clients", multiple=True, metavar="NAME", help="A host given a client certificate."
)
def pki(pki_dir: Path, members: tuple[str, ...], clients: tuple[str, ...]) -> None:
    """Make the store's CA, member and client certificates; keep those still valid.

    Prints {"changed": [files (re)made], "cluster_token": ...} as JSON (site.yml reads it).
    """
    from pdctl.coord import pki as pki_mod

    parsed = [pki_mod.parse_member(m) for m in members]
    changed = pki_mod.ensure(pki_dir, parsed, list(clients))
    token = pki_mod.cluster_token(pki_dir)
    click.echo(json.dumps({"changed": changed, "cluster_token": token}))
