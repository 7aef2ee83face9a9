"""`pdctl finish`: restarts whose restarter died, finished or undone (pdctl.ops.finish)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from pdctl.cli.options import format_option, load_source, lock_wait_option, source_options
from pdctl.coord import restarts
from pdctl.ops.context import store_of

LOCK_WAIT_S = 60.0


@click.command()
@source_options
@format_option
@click.option(
    "--host",
    default=None,
    metavar="HOST",
    help="Only groups with a member on HOST (the timer passes its own).",
)
@lock_wait_option(LOCK_WAIT_S)
def finish(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    fmt: str,
    host: str | None,
    lock_wait: float,
) -> None:
    """Finish or undo the restarts whose restarter died half-way.

    Every restart records in etcd the step each of its groups is in, conditional on holding
    the fleet restart lock. A record whose restarter no longer holds the lock (killed, its
    host lost or cut off, its lock broken) is abandoned; `pdctl status` shows it. This takes
    the lock and takes each one up where it stopped: died draining, it is undone (the group's
    canaries, then it is registered again: its engines never stopped); at the health wait or
    later, resumed from the health wait; stopping or starting, the whole coordinated restart
    runs, as a recovery (nothing waits for requests). pdstack-finish.timer runs it on every
    engine host (`--host` its own); an operator may run it at any time.

    \b
    Exit codes: 0 nothing abandoned, or all finished; 1 a group failed (it stays out of the
    gateways; journal lines follow); 2 bad input; 3 a restart
    held the lock past --lock-wait; 5 etcd cannot serve (or the topology names none).
    \b
    Examples:
      pdctl finish
      pdctl finish --host gpu-07 --format json
    """
    src = load_source(topology_path, inventory, profile)
    # The timer's every run: one etcd read, before the restart stack is imported.
    if not restarts.abandoned(store_of(src)[0]):
        _say_nothing(fmt)
        return
    from pdctl.cli.reports import print_reports
    from pdctl.ops import finish as ops_finish
    from pdctl.ops.context import real_ops

    reports = ops_finish.finish(real_ops(src), host, lock_wait)
    if fmt == "json":
        click.echo(json.dumps({"finished": [asdict(r) for r in reports]}, indent=2))
    elif not reports:
        _say_nothing(fmt)
    else:
        print_reports(reports, fmt)
    sys.exit(0 if all(r.ok for r in reports) else 1)


def _say_nothing(fmt: str) -> None:
    click.echo(json.dumps({"finished": []}) if fmt == "json" else "no abandoned restart")
