"""`pdctl lock show | break` and `pdctl history`: the fleet restart lock and the restarts it
let through, as etcd holds them (pdctl.coord)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from pdctl.cli.options import format_option, load_source, source_options
from pdctl.coord.history import History, Record
from pdctl.coord.lock import Holder, RestartLock, holder_json
from pdctl.errors import PdctlError
from pdctl.ops.context import store_of


def _fleet_lock(topology_path: Path, inventory: Path, profile: Path | None) -> RestartLock:
    store, c = store_of(load_source(topology_path, inventory, profile))
    return RestartLock(store, c.lock_ttl_s)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _line(h: Holder) -> str:
    renewed = f", renewed {h.heartbeat_age_s:.0f}s ago (ttl {h.ttl_s:g}s)" if h.ttl_s else ""
    return f"held by {h.describe()}{renewed}"


@click.group()
def lock() -> None:
    """The fleet restart lock: one restart at a time across every host and controller.

    A key in etcd under a lease that its holder renews; etcd deletes it ttl seconds after
    the last renewal (holder killed, paused or cut off), so a dead holder never blocks."""


@lock.command("show")
@source_options
@format_option
def show(topology_path: Path, inventory: Path, profile: Path | None, fmt: str) -> None:
    """Who holds the fleet restart lock, since when, and when it last renewed it.

    Exit 0 (free or held), 5 when etcd cannot answer."""
    held = _fleet_lock(topology_path, inventory, profile).holder()
    if fmt == "json":
        click.echo(json.dumps({"held": held is not None, "holder": holder_json(held)}, indent=2))
    else:
        click.echo(_line(held) if held else "free")


@lock.command("break")
@source_options
@click.option("--force", is_flag=True, help="Required: this is never the normal way.")
def break_(topology_path: Path, inventory: Path, profile: Path | None, force: bool) -> None:
    """End the holder's lease now, and say whose it was.

    Only the holder read here loses it: its lease is revoked, which deletes the key only
    while it is still under that lease (a restarter that took the lock since keeps it).

    Only for a holder known to be gone whose lease you cannot wait out: a holder that is
    still running stops before its next step (it checks the lease before each one), and may
    leave its current pair drained (pdctl status shows it)."""
    if not force:
        raise PdctlError("pdctl lock break ends another restart's lease: add --force")
    held = _fleet_lock(topology_path, inventory, profile).force_break()
    click.echo(
        f"broke the fleet restart lock: it was {_line(held)}"
        if held
        else "the fleet restart lock is free: nothing to break"
    )


def _record_line(r: Record) -> str:
    took = f"{r.ended - r.started:.0f}s" if r.ended else "-"
    what = r.result.upper() if r.result != "ok" else "ok"
    error = f"  {r.error}" if r.error else ""
    return f"{_clock(r.started)}  {r.host:<12} {r.pid:>7}  {what:<7} {took:>6}  {r.command}{error}"


@click.command()
@source_options
@format_option
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Newest N."
)
def history(
    topology_path: Path, inventory: Path, profile: Path | None, fmt: str, limit: int
) -> None:
    """The fleet's restarts, newest first: who, from where, what, how long each phase took,
    and how it ended (ok, failed, lost: its lease expired before it finished; running).

    Every restart and recovery that held the fleet restart lock writes one record to etcd;
    the oldest beyond 500 are dropped."""
    records = History(_fleet_lock(topology_path, inventory, profile).store).records(limit)
    if fmt == "json":
        click.echo(json.dumps({"restarts": [r.model_dump() for r in records]}, indent=2))
        return
    if not records:
        click.echo("no restarts recorded")
    for r in records:
        click.echo(_record_line(r))
        for target, phases in r.phases.items():
            steps = " ".join(f"{k} {v:.1f}s" for k, v in phases.items())
            click.echo(f"    {target}: {steps}")
