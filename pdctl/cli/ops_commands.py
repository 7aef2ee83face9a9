"""`pdctl status | restart | doctor | recover | gateway register | gateway heartbeat`:
operate the running deployment."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.live import Live

from pdctl.cli.options import (
    deprecated,
    fleet_lock_option,
    format_option,
    former_name,
    load_source,
    lock_wait_option,
    source_options,
)
from pdctl.cli.reports import print_reports, warn
from pdctl.cli.status_view import to_json, view
from pdctl.errors import PdctlError
from pdctl.lint import Severity
from pdctl.ops import lock, roll
from pdctl.ops.context import Ops, Timeouts, real_ops, restart_lock
from pdctl.ops.doctor import doctor as run_doctor
from pdctl.ops.restart import (
    Report,
    outcome,
    plan_lines,
    register_gateways,
    restart_gateways,
    restart_instance,
    roll_held,
    roll_order,
)
from pdctl.ops.status import collect
from pdctl.pdclient import CANARIES_DOCTOR, CANARIES_STATUS
from pdctl.spec import Role

if TYPE_CHECKING:
    from pdctl.coord.lock import RestartLock
    from pdctl.ops.source import Pair

F = TypeVar("F", bound=Callable[..., Any])

LONE_RESTART_REFUSAL = (
    "refusing to restart the {role} alone: with NIXL the surviving side keeps stale peer "
    "metadata and the group stays degraded (requests fail or hang until both restart; the "
    "seed's production incident). Use --both. --force restarts it alone anyway."
)


def _ops(
    topology_path: Path, inventory: Path, profile: Path | None, timeouts: Timeouts | None = None
) -> Ops:
    return real_ops(load_source(topology_path, inventory, profile), timeouts)


@click.command()
@source_options
@format_option
@click.option(
    "--watch",
    "watch",
    type=float,
    default=None,
    is_flag=False,
    flag_value=5.0,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 5) until Ctrl-C.",
)
@click.option(
    "--canaries",
    type=click.IntRange(min=1),
    default=CANARIES_STATUS,
    show_default=True,
    help="Requests per group canary (a degraded group fails only a share).",
)
def status(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    fmt: str,
    watch: float | None,
    canaries: int,
) -> None:
    """Every host, group, engine and gateway, and who holds the fleet restart lock.

    All probes run at once, each with its own timeout: the wall time is the slowest probe's,
    not the sum. Grouped per host; per group: the gateway's routing and a real request through
    its PD path, with its latency, and "restart pending" when site.yml changed its
    files without restarting it; per engine: unit state, PID, uptime, /health,
    running and queued requests, KV usage, CUDA graph or eager, generation tok/s and the
    gateway's view. A group of layout.groups is shown with its shape (group 2P1D) and its
    engines by member (prefill0, prefill1, decode0); in JSON its entry under "pairs" (the
    key names every group) lists them under "members". Lines fit the terminal (80 columns
    too): nothing is cut, the rest of a line continues under it. Exit 0 when everything is
    healthy, 1 if not.

    \b
    Examples:
      pdctl status
      pdctl status --watch 2
      pdctl status --format json | jq '.pairs[] | select(.canary.ok | not)'
    """
    ops = _ops(topology_path, inventory, profile)
    if watch is not None and fmt == "table":
        with Live(console=Console(), auto_refresh=False) as live:
            while True:  # until Ctrl-C
                live.update(view(collect(ops, canaries)), refresh=True)
                time.sleep(watch)
    while True:
        s = collect(ops, canaries)
        if fmt == "json":
            click.echo(json.dumps(to_json(s), indent=2))
        else:
            Console().print(view(s))
        if watch is None:
            sys.exit(0 if s.healthy else 1)
        time.sleep(watch)


@click.command()
@source_options
@format_option
@click.option("--both", is_flag=True, help="Restart prefill and decode of each group together.")
@click.option("--prefill", is_flag=True, help="Prefill alone: refused without --force.")
@click.option("--decode", is_flag=True, help="Decode alone: refused without --force.")
@click.option(
    "--gateways",
    is_flag=True,
    help="Restart only the gateways, one at a time (they hold no state).",
)
@former_name("--router", "--gateways", is_flag=True)
@click.option(
    "--pair", "pairs", multiple=True, metavar="NAME", help="Group NAME or HOST/NAME; repeatable."
)
@click.option(
    "--all",
    "all_pairs",
    is_flag=True,
    help="Every group, one at a time (or --max-unavailable at once).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--force", is_flag=True, help="Allow --prefill/--decode alone (degrades their group)."
)
@click.option("--drain-timeout", type=float, default=Timeouts.drain, show_default=True)
@click.option("--health-timeout", type=float, default=Timeouts.health, show_default=True)
@click.option("--canary-timeout", type=float, default=Timeouts.canary, show_default=True)
@lock_wait_option(0.0)
@click.option(
    "--max-unavailable",
    metavar="K|P%",
    default=None,
    help="Roll up to K groups at once (a count, or a percentage of the fleet's groups, "
    "rounded down, at least 1), groups of one host in a row, above the --min-serving floor. "
    "Default: one at a time, no floor.",
)
@click.option(
    "--min-serving",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="The floor: a group is taken out only while the gateways still route to N groups "
    "once it is out. Default with --max-unavailable: all groups but K.",
)
@click.option(
    "--include-drained",
    is_flag=True,
    help="With a floor: restart chosen groups that are out of the gateways already (first); "
    "without it they are refused.",
)
@click.option(
    "--floor-timeout",
    type=click.FloatRange(min=0),
    default=Timeouts.floor,
    show_default=True,
    metavar="SECS",
    help="With none of its groups out, wait up to SECS for the floor, then stop the roll.",
)
@fleet_lock_option
def restart(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    fmt: str,
    both: bool,
    prefill: bool,
    decode: bool,
    gateways: bool,
    router: bool,
    pairs: tuple[str, ...],
    all_pairs: bool,
    yes: bool,
    force: bool,
    drain_timeout: float,
    health_timeout: float,
    canary_timeout: float,
    lock_wait: float,
    max_unavailable: str | None,
    min_serving: int | None,
    include_drained: bool,
    floor_timeout: float,
    no_fleet_lock: bool,
) -> None:
    """Restart PD groups the safe way: drain, stop all, start all, verify, re-register.

    A group (a pair is a 1P1D group) is restarted as one: the gateway stops routing to it and
    in-flight requests finish (bounded), its engines stop and start through the group's
    systemd target, then /health on each, canary requests through its PD paths, and only then
    the gateway routes to it again. --all rolls groups one at a time and stops at the first
    failure.

    --max-unavailable K rolls up to K groups at once (never a group split), each through the
    same steps, under the one fleet lock. Before each group is drained, the gateways' own
    view must keep --min-serving groups routed once it is out (default: all but K); else the
    roll waits for one of its groups to come back (or, with none out, --floor-timeout), then
    stops. The first failure stops new groups from starting; those restarting finish and are
    reported; the rest are listed untouched. A chosen group already out of the gateways is
    refused (--include-drained restarts it, first). Progress on stderr: groups out, done,
    left, and the time to go, from the phase times of the groups done.

    One restart at a time across the fleet: this host's lock (/run/pdstack/restart.lock),
    then the fleet restart lock in etcd (a key under a lease renewed while the restart runs;
    pdctl lock show). Before each step the restart checks the lease is still its own: one
    that lost it (paused past the ttl, cut off) stops there and says so. A holder that
    stopped renewing loses the lock after the ttl; the next restart warns whom it followed.
    If etcd cannot serve (no quorum, no member answers), nothing restarts (exit 5). Each
    restart is recorded in the fleet's history (pdctl history).

    \b
    Exit codes: 0 done; 1 a group failed (journal lines follow), or a roll's floor was not
    met within --floor-timeout; 2 bad input or refused;
    3 another restart holds the lock (after --lock-wait); 5 etcd cannot serve the fleet
    restart lock; 130 interrupted (Ctrl-C): the message names every group left out of the
    gateway and the command that puts them back.
    \b
    Examples:
      pdctl restart --both --pair pd0
      pdctl restart --both --all --yes
      pdctl restart --both --all --max-unavailable 25% --yes
      pdctl restart --gateways
    """
    if router:
        deprecated("--router", "--gateways")
        gateways = True
    sides = [r for r, on in ((Role.PREFILL, prefill), (Role.DECODE, decode)) if on]
    bounded = max_unavailable is not None or min_serving is not None or include_drained
    _check_mode(both, sides, gateways, force, bounded)
    timeouts = Timeouts(
        drain=drain_timeout, health=health_timeout, canary=canary_timeout, floor=floor_timeout
    )
    ops = _ops(topology_path, inventory, profile, timeouts)
    k = max_unavailable if max_unavailable is not None else ("1" if bounded else None)
    budget = roll.budget(k, min_serving, len(ops.source.pairs()))
    run = _Restart(ops, restart_lock(ops, no_fleet_lock, warn), lock_wait, yes)
    if gateways:
        reports = _restart_gateways(run)
    elif sides:
        reports = _restart_sides(run, ops.source.select(pairs, all_pairs), sides)
    else:
        reports = _restart_groups(run, ops.source.select(pairs, all_pairs), budget, include_drained)
    print_reports(reports, fmt)
    sys.exit(0 if all(r.ok for r in reports) else 1)


def _check_mode(both: bool, sides: list[Role], gateways: bool, force: bool, bounded: bool) -> None:
    """One mode per restart; a side alone only with --force; a roll's bounds only for groups."""
    if sum([both, bool(sides), gateways]) != 1:
        raise PdctlError(
            "say what to restart: --both (groups), --gateways, or --prefill/--decode with --force"
        )
    if sides and not force:
        raise PdctlError(LONE_RESTART_REFUSAL.format(role=" and ".join(sides)))
    if bounded and not both:
        raise PdctlError("--max-unavailable, --min-serving and --include-drained go with --both")


@dataclass
class _Restart:
    """What every mode of `pdctl restart` shares: the ops, the fleet lock (None with
    --no-fleet-lock), --lock-wait and --yes."""

    ops: Ops
    fleet: RestartLock | None
    lock_wait: float
    yes: bool

    def locked(self, what: str, targets: list[str]) -> AbstractContextManager[lock.Acquired]:
        """The restart lock for `what` (the command line the history and holders show)."""
        return lock.held(
            what,
            wait=self.lock_wait,
            say=self.ops.say,
            poll=self.ops.timeouts.poll,
            fleet=self.fleet,
            targets=targets,
        )

    def confirm(self, targets: list[str], question: str) -> None:
        _confirm(self.yes, targets, question)


def _restart_gateways(run: _Restart) -> list[Report]:
    """--gateways: every gateway, one at a time."""
    gateways = run.ops.source.topology.gateways
    run.confirm(
        [f"gateway {r.unit} on {r.host} ({r.url})" for r in gateways],
        "Restart the gateways, one at a time? Requests in flight through each one fail.",
    )
    with run.locked("pdctl restart --gateways", [f"{r.host}/{r.unit}" for r in gateways]) as got:
        reports = restart_gateways(run.ops)
        got.record(outcome(reports))
    return reports


def _restart_sides(run: _Restart, chosen: list[Pair], sides: list[Role]) -> list[Report]:
    """--prefill/--decode --force: those engines alone, leaving their groups degraded."""
    insts = [i for p in chosen for s in sides for i in p.instances if i.role is s]
    run.confirm(
        [f"{i.id} ({i.unit})" for i in insts],
        "Restart these ALONE? Their groups will be degraded until both restart.",
    )
    with run.locked("pdctl restart --force (one side)", [i.id for i in insts]) as got:
        reports = [restart_instance(run.ops, i) for i in insts]
        got.record(outcome(reports))
    warn("Warning: the group is likely degraded now; run pdctl restart --both.")
    return reports


def _restart_groups(
    run: _Restart, chosen: list[Pair], budget: roll.Budget, include_drained: bool
) -> list[Report]:
    """--both: the chosen groups whole, one at a time, or up to K at once above the floor
    (`budget`; groups already out of the gateways first with `include_drained`)."""
    chosen = roll_order(run.ops, chosen, budget, include_drained)
    for line in plan_lines(run.ops, chosen, budget):
        click.echo(line, err=True)
    run.confirm(
        [f"{p.id}: {' + '.join(i.unit for i in p.instances)}" for p in chosen],
        f"Restart {len(chosen)} group(s) as above?",
    )
    return roll_held(run.ops, chosen, budget, run.locked, "pdctl restart --both")


def _confirm(yes: bool, targets: list[str], question: str) -> None:
    click.echo("Targets:", err=True)
    for t in targets:
        click.echo(f"  {t}", err=True)
    if not yes:
        click.confirm(question, abort=True, err=True)


@click.command()
@source_options
@format_option
@click.option(
    "--canaries",
    type=click.IntRange(min=1),
    default=CANARIES_DOCTOR,
    show_default=True,
    help="Requests per group canary; a degraded group fails a share of them.",
)
def doctor(
    topology_path: Path, inventory: Path, profile: Path | None, fmt: str, canaries: int
) -> None:
    """Find what is wrong with the running deployment, and what to run about it.

    `pdctl validate` (with -i/-p) plus live checks: degraded groups (canary fails while every
    member answers /health), members the gateway holds under another group's pairing
    protocol or none, eager decode batches, KV held while idle, flags of the running
    processes differing from the rendered ones (drift), failed or restarting units, restarts
    abandoned half-way (pdctl finish).
    Exit 0 clean, 1 warnings only, 2 errors.
    """
    ops = _ops(topology_path, inventory, profile)
    findings, _ = run_doctor(ops, canaries)
    errors = sum(f.severity is Severity.ERROR for f in findings)
    if fmt == "json":
        click.echo(json.dumps({"findings": [asdict(f) for f in findings]}, indent=2))
    elif not findings:
        click.secho("No problems found.", fg="green")
    for f in findings if fmt == "table" else []:
        color = "red" if f.severity is Severity.ERROR else "yellow"
        click.secho(f"{f.severity.upper()} {f.id} [{f.where}]: {f.message}", fg=color)
        click.echo(f"    fix: {f.fix}")
    sys.exit(2 if errors else 1 if findings else 0)


@click.group()
def gateway() -> None:
    """The gateways (smg): every host of the inventory's [router] group runs one."""


@gateway.command("register")
@source_options
@format_option
@click.option(
    "--gateway",
    "hosts",
    multiple=True,
    metavar="HOST",
    help="The gateway on inventory host HOST; repeatable. Default: every gateway.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for each gateway to answer (it may be starting).",
)
def register(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    fmt: str,
    hosts: tuple[str, ...],
    timeout: float,
) -> None:
    """Register every group with the gateways, each group bound by its id.

    smg starts with no workers; the gateway unit runs this after every start
    (ExecStartPost=), so each group's prefills and decodes carry the group's id as pairing
    protocol and smg never combines one group's prefill with another group's decode.

    It does not wait for the engines: smg adds each worker once its engine answers. Safe to
    run again: workers a gateway holds are left alone; one held without its group's protocol
    is reported "unbound" (pdctl restart --both --pair NAME rebinds it without failing
    requests), one being drained "draining" (a restart is under way). A worker whose URL is
    no instance of the topology (its group left the profile) is removed and listed.

    \b
    Exit codes: 0 done; 1 a gateway did not answer within --timeout; 2 bad input.
    \b
    Examples:
      pdctl gateway register
      pdctl gateway register --gateway router-1 --timeout 30
    """
    done = register_gateways(_ops(topology_path, inventory, profile), hosts, timeout)
    if fmt == "json":
        click.echo(json.dumps([asdict(d) for d in done], indent=2))
    else:
        for d in done:
            if d.error:
                click.secho(f"FAILED: {d.host} ({d.url}): {d.error}", fg="red")
                continue
            counts = Counter(state.split(" ")[0] for state in d.workers.values())
            summary = ", ".join(f"{n} {state}" for state, n in counts.items())
            click.echo(f"OK: {d.host} ({d.url}): {summary or 'no workers'}")
            for url, state in d.workers.items():
                if state == "removed":
                    click.echo(f"  Removed: {url} (no instance of the topology)")
                elif state not in ("added", "bound"):
                    click.secho(f"  Warning: {url} {state}", fg="yellow")
    sys.exit(1 if any(d.error for d in done) else 0)


@gateway.command("heartbeat")
@source_options
@click.option(
    "--gateway", "host", required=True, metavar="HOST", help="The gateway's inventory host."
)
def heartbeat(topology_path: Path, inventory: Path, profile: Path | None, host: str) -> None:
    """Keep this gateway's liveness key in etcd while it runs (pdstack-gateway-lease.service).

    The key lives under a lease renewed every ttl/3 (etcd.gateway_ttl_s); it ends with this
    process (SIGTERM revokes it), or ttl seconds after the host stops renewing it (lost,
    powered off). A restart that cannot reach a gateway without a key goes on without it;
    one that holds its key and does not answer blocks the restart. Runs until stopped.
    """
    import signal
    import threading

    from pdctl.coord.gateways import heartbeat as keep_alive
    from pdctl.ops.context import store_of

    src = load_source(topology_path, inventory, profile)
    store, coord = store_of(src)
    url = src.topology.gateway(host).url
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    keep_alive(store, host, url, coord.gateway_ttl_s, stop, lambda line: click.echo(line))
