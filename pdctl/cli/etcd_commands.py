"""`pdctl etcd`: the coordination store's controller-side chores (the TLS files, the member
set check before site.yml starts members)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click


def _pki_and_members(f: Callable[..., None]) -> Callable[..., None]:
    """--dir (the controller's PKI directory, the CA key in it) and --member NAME=ADDRESS."""
    f = click.option(
        "--member",
        "members",
        multiple=True,
        metavar="NAME=ADDRESS",
        help="An [etcd] host and its address (repeat per member).",
    )(f)
    return click.option(
        "--dir",
        "pki_dir",
        type=click.Path(path_type=Path, file_okay=False),
        required=True,
        help="The controller's PKI directory (holds the CA key; keep it off the hosts).",
    )(f)


@click.group()
def etcd() -> None:
    """The coordination store (etcd on the inventory's [etcd] hosts)."""


@etcd.command("pki")
@_pki_and_members
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


@etcd.command("members")
@_pki_and_members
@click.option(
    "--client-port", type=click.IntRange(1, 65535), required=True, help="etcd.client_port"
)
@click.option("--peer-port", type=click.IntRange(1, 65535), required=True, help="etcd.peer_port")
@click.option("--data", "with_data", multiple=True, metavar="NAME", help="A member with data.")
@click.option("--no-data", "without", multiple=True, metavar="NAME", help="A member without.")
@click.option(
    "--state",
    type=click.Choice(["new", "existing"]),
    default="new",
    show_default=True,
    help="How site.yml starts a member without data (--initial-cluster-state).",
)
def members(
    pki_dir: Path,
    members: tuple[str, ...],
    client_port: int,
    peer_port: int,
    with_data: tuple[str, ...],
    without: tuple[str, ...],
    state: str,
) -> None:
    """Check the running store's members against [etcd] before site.yml starts any.

    Hosts named by neither --data nor --no-data are not in this run. Fails (exit 2) with one
    line per host that must change first (etcdctl member add/remove, or joining as existing).
    """
    from pdctl.coord import members as members_mod
    from pdctl.coord import pki as pki_mod
    from pdctl.errors import PdctlError
    from pdctl.topology import TopologyCoord

    parsed = [pki_mod.parse_member(m) for m in members]
    known = {m.name for m in parsed}
    if unknown := sorted((set(with_data) | set(without)) - known):
        raise PdctlError(f"--data/--no-data {', '.join(unknown)}: not a --member")
    wanted = [
        members_mod.Wanted(
            m.name,
            f"https://{m.address}:{peer_port}",
            True if m.name in with_data else False if m.name in without else None,
        )
        for m in parsed
    ]
    running = None
    if not all(w.has_data is False for w in wanted):  # a new store has nothing to ask yet
        endpoints = [f"https://{m.address}:{client_port}" for m in parsed]
        coord = TopologyCoord.model_validate(
            {"endpoints": endpoints, **pki_mod.controller_tls(pki_dir)}
        )
        running = members_mod.running(coord)
    if problems := members_mod.check(wanted, running, state):
        raise PdctlError("\n".join(problems))
