"""Options shared by several commands, defined once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from pdctl.names import TOPOLOGY_FILE

if TYPE_CHECKING:
    from pdctl.ops.source import Source

F = TypeVar("F", bound=Callable[..., Any])


def deployment_options(f: F) -> F:
    """-i/--inventory and -p/--profile; the profile defaults to the inventory's pdstack_profile."""
    f = click.option(
        "-p",
        "--profile",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Deployment profile (default: the inventory's pdstack_profile variable).",
    )(f)
    return click.option(
        "-i",
        "--inventory",
        type=click.Path(path_type=Path, dir_okay=False),
        default=lambda: os.environ.get("PDSTACK_INVENTORY", "inventory.ini"),
        show_default="$PDSTACK_INVENTORY or inventory.ini",
        help="Ansible inventory naming the hosts ([pd_hosts], [router], [monitoring]).",
    )(f)


def source_options(f: F) -> F:
    """-i/-p, and --topology: where an ops command learns the deployment (`load_source`)."""
    f = deployment_options(f)
    return click.option(
        "--topology",
        "topology_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=lambda: os.environ.get("PDSTACK_TOPOLOGY", TOPOLOGY_FILE),
        show_default=TOPOLOGY_FILE,
        help="Topology file site.yml wrote on this host; used unless -i/-p are given.",
    )(f)


def load_source(topology_path: Path, inventory: Path, profile: Path | None) -> Source:
    """The deployment from -i/-p when either is given, else the topology file."""
    from pdctl.ops import source  # not at import: `pdctl validate` never loads the ops stack

    ctx = click.get_current_context()
    explicit = (
        ctx.get_parameter_source("inventory") is not ParameterSource.DEFAULT
        or "PDSTACK_INVENTORY" in os.environ
        or profile is not None
    )
    return source.load(Path(topology_path), inventory if explicit else None, profile)


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts.",
)


instance_option = click.option(
    "--instance",
    "only",
    multiple=True,
    metavar="NAME",
    help="Only these instances (host/name or name, e.g. pd0-decode); repeatable.",
)


def lock_wait_option(default: float, store: bool = False) -> Callable[[F], F]:
    """--lock-wait SECS: how long a command waits for a restart that holds the restart lock
    (this host's or the fleet's) before it exits 3; `store`: for etcd to serve again too
    (exit 5 after it), as recover does."""
    also = " or for etcd to serve again" if store else ""
    then = "then exit 3 (held) or 5 (etcd)" if store else "then exit 3"
    return click.option(
        "--lock-wait",
        type=click.FloatRange(min=0),
        default=default,
        show_default=True,
        metavar="SECS",
        help=f"Wait up to SECS for a restart holding the lock{also} (progress every 10 s), {then}.",
    )


def fleet_lock_option(f: F) -> F:
    return click.option(
        "--no-fleet-lock",
        is_flag=True,
        help="DANGEROUS: restart without the fleet restart lock (only this host's lock), when "
        "etcd has no quorum. Restarts started elsewhere may then run at the same time.",
    )(f)


def former_name(old: str, new: str, **kw: Any) -> Callable[[F], F]:
    """`old`, what `new` was called before (`kw`: its type): hidden from --help, it still
    works, so scripts and playbooks keep running, and the command warns (`deprecated`)."""
    return click.option(old, hidden=True, help=f"Former name of {new}.", **kw)


def deprecated(old: str, new: str) -> None:
    click.secho(
        f"Warning: {old} is deprecated and will be removed: use {new}", fg="yellow", err=True
    )
