"""`pdctl recover`: the coordinated restart of a crashed group, run by the engine units'
OnFailure= (pdstack-recover@GROUP.service).

A module of its own: its start-up counts towards the time from the crash to the group serving
again (benchmarks/recovery_phases.py), so it imports the recovery's code path and nothing of
the other ops commands (status, doctor and their rendering).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pdctl import exits
from pdctl.cli.options import (
    deprecated,
    fleet_lock_option,
    former_name,
    load_source,
    lock_wait_option,
    source_options,
)
from pdctl.cli.reports import print_reports, warn
from pdctl.ops.context import real_ops, restart_lock
from pdctl.ops.recover import (
    DEFAULT_STATE,
    LOCK_WAIT_S,
    RateLimit,
    RecoveryLog,
    default_state,
)
from pdctl.ops.recover import recover as run_recover


@click.command()
@source_options
@click.option("--pair", "pair_name", required=True, metavar="NAME", help="Group NAME or HOST/NAME.")
@click.option(
    "--max-recoveries",
    type=click.IntRange(min=1),
    default=RateLimit.max_count,
    show_default=True,
    help="Recoveries of one group allowed within --window.",
)
@click.option(
    "--window",
    default=RateLimit.window_s,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds.",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=default_state,
    show_default=f"$PDCTL_RECOVER_STATE or {DEFAULT_STATE}",
    help="Rate-limit state; its folder must be writable by this user only (created 0700).",
)
@lock_wait_option(LOCK_WAIT_S, store=True)
@former_name("--lock-timeout", "--lock-wait", type=click.FloatRange(min=0))
@fleet_lock_option
def recover(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    pair_name: str,
    max_recoveries: int,
    window: float,
    state_path: Path,
    lock_wait: float,
    lock_timeout: float | None,
    no_fleet_lock: bool,
) -> None:
    """Coordinated restart of a group after one of its engines failed (run by systemd).

    Each engine unit has OnFailure=pdstack-recover@GROUP.service, which runs this. It
    restarts the whole group (never the failed engine alone), at most --max-recoveries times per
    --window: past that it exits 4 and leaves the failed unit failed, so the alert fires.
    If another restart holds the lock (this host's, or the fleet restart lock), or etcd
    cannot serve (no quorum), it waits (--lock-wait), then recovers. While it waits, the
    group is taken out of every gateway that answers and all its engines are stopped, so no
    request meets a half group; `pdctl status` shows "recovery waiting" and why. After the
    wait it exits 3 or 5 and systemd starts it again, for as long as it takes. An unreadable
    state file is started afresh with a warning.

    \b
    Exit codes: 0 recovered; 2 bad input or an unsafe state folder; 3 the lock stayed
    held; 4 rate-limited; 5 etcd cannot serve; 6 the restart failed (journal lines follow;
    systemd tries again, within the rate limit).
    """
    if lock_timeout is not None:
        deprecated("--lock-timeout", "--lock-wait")
        lock_wait = lock_timeout
    ops = real_ops(load_source(topology_path, inventory, profile))
    ops.fleet_lock = restart_lock(ops, no_fleet_lock, warn)
    (pair,) = ops.source.select((pair_name,), False)
    limit = RateLimit(max_recoveries, window)
    rep = run_recover(
        ops,
        pair,
        limit,
        RecoveryLog(state_path, warn=lambda line: warn(f"Warning: {line}")),
        lock_wait=lock_wait,
    )
    print_reports([rep], "table")
    sys.exit(exits.OK if rep.ok else exits.RESTART_FAILED)
