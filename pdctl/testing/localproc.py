"""The ops actions over local processes instead of systemd units: for rehearsals, the
integration tests and benchmarks/restart_*.py.

`LocalUnits` implements the Systemd interface over pdctl.testing.stack processes (started and
stopped by PID); a pair's or group's target names its units, as `PartOf=`/`Wants=` do on a
host. As systemctl does, a stop waits only for the units it names: a target named alone returns
at once while its units go on stopping (a target is ordered After= the units it wants, so its
own stop job is done first), and a start of a unit still stopping waits for that stop.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pdctl import names
from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Store
from pdctl.ops import release
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.gateway import GatewayAdmin
from pdctl.ops.restart import register_pair
from pdctl.ops.source import Source
from pdctl.ops.systemd import Systemd, UnitStatus
from pdctl.spec import Deployment, Role
from pdctl.testing.stack import Gateway, SimProc, cross_group_transfers, smg_binary, start_gateway
from pdctl.topology import (
    Topology,
    TopologyCoord,
    TopologyGateway,
    TopologyGroup,
    TopologyInstance,
    TopologyPair,
)

HOST = "local"
# SIGKILL after this long, as systemd does after TimeoutStopSec (120 s on the engine units):
# long enough for an engine's graceful stop to run out its own timeout first.
STOP_GRACE_S = 30.0


@dataclass
class LocalPair:
    name: str
    prefill: SimProc
    decode: SimProc

    def members(self) -> list[tuple[Role, int | None, SimProc]]:
        """(role, member number, process); a pair's sides have no number (pdctl.names)."""
        return [(Role.PREFILL, None, self.prefill), (Role.DECODE, None, self.decode)]

    @property
    def target(self) -> str:
        return names.pair_target(self.name)


@dataclass
class LocalGroup:
    """An xPyD group: its members are named g0-prefill0, g0-prefill1, ... `across`: a group
    whose members name their hosts (each on the pretend host of its address, host_of), once
    in the fleet; else host-local."""

    name: str
    prefills: list[SimProc]
    decodes: list[SimProc]
    across: bool = False

    def members(self) -> list[tuple[Role, int | None, SimProc]]:
        roles = ((Role.PREFILL, self.prefills), (Role.DECODE, self.decodes))
        return [(role, n, sim) for role, sims in roles for n, sim in enumerate(sims)]

    @property
    def target(self) -> str:
        return names.pair_target(self.name)


Local = LocalPair | LocalGroup


def deployed(dep: Deployment, log_dir: Path) -> list[Local]:
    """A sim deployment's pairs and groups as local processes (not started), each engine as
    its unit would run it (SimProc.rendered); for a profile whose engines all listen on
    127.0.0.1, the pretend host `local`."""
    units: list[Local] = []
    for g in dep.groups():
        prefills = [SimProc.rendered(i, dep, log_dir) for i in g.prefills]
        decodes = [SimProc.rendered(i, dep, log_dir) for i in g.decodes]
        if g.is_pair:
            units.append(LocalPair(g.name, prefills[0], decodes[0]))
        else:
            units.append(LocalGroup(g.name, prefills, decodes, across=g.host is None))
    return units


def host_of(sim: SimProc) -> str:
    """The pretend host an engine runs on: `local` on 127.0.0.1, else its loopback address
    (127.0.0.2 plays a second host)."""
    return HOST if sim.address == "127.0.0.1" else sim.address


class LocalUnits:
    def __init__(self, pairs: Sequence[Local], host: str = HOST) -> None:
        """The units of `host`: the members of `pairs` that run there."""
        self.host = host
        self.procs: dict[str, SimProc] = {}
        self.targets: dict[str, list[str]] = {}
        for p in pairs:
            units = {
                names.engine_unit(p.name, r.value, n): sim
                for r, n, sim in p.members()
                if host_of(sim) == host
            }
            self.procs |= units
            if units:
                self.targets[p.target] = list(units)
        self.stopped: set[str] = set()  # stopped by a job: inactive rather than failed
        # Stops a target's stop left running (PartOf=): a start of the unit waits for them.
        self.stopping: dict[str, threading.Thread] = {}
        self.jobs: list[tuple[str, str]] = []  # (verb, unit), for tests to inspect
        self.files: dict[str, str] = {}  # the host's files pdctl reads (restart-pending markers)
        self.base_env = {u: dict(sim.env) for u, sim in self.procs.items()}
        # A release environment's path -> what running from it means for the sim (its PDSIM_*
        # knobs): a "version" in the rehearsal is what its environment says it is.
        self.environments: dict[str, dict[str, str]] = {}

    def _expand(self, units: tuple[str, ...]) -> list[str]:
        """The units named, a target as its two units; each once (one job per unit)."""
        return list(dict.fromkeys(u for name in units for u in self.targets.get(name, [name])))

    def _each(self, verb: str, units: tuple[str, ...], fn: Callable[[SimProc], object]) -> None:
        names = self._expand(units)
        self.jobs += [(verb, u) for u in names]
        with ThreadPoolExecutor(max_workers=max(len(names), 1)) as pool:
            list(pool.map(lambda u: fn(self.procs[u]), names))

    def show(self, unit: str) -> UnitStatus:
        if unit not in self.procs:  # what systemctl shows of a unit it has no file for
            return UnitStatus(unit, "not-found", "inactive", "dead", 0, None, 0)
        proc = self.procs[unit]
        p = proc.proc
        if p is not None and p.poll() is None:
            if self._still_stopping(unit):
                return UnitStatus(unit, "loaded", "deactivating", "stop-sigterm", p.pid, None, 0)
            return UnitStatus(unit, "loaded", "active", "running", p.pid, None, 0, proc.argv)
        failed = p is not None and unit not in self.stopped
        state = ("failed", "failed") if failed else ("inactive", "dead")
        return UnitStatus(unit, "loaded", *state, 0, None, 0, proc.argv)

    def _still_stopping(self, unit: str) -> bool:
        t = self.stopping.get(unit)
        return t is not None and t.is_alive()

    def _start_one(self, unit: str) -> None:
        behind = self.stopping.pop(unit, None)
        if behind is not None:
            behind.join()  # systemd runs a start queued behind a running stop after it
        s = self.procs[unit]
        if s.proc is None or s.proc.poll() is not None:
            s.start()

    def start(self, *units: str) -> None:
        names = self._expand(units)
        self.stopped -= set(names)
        self.jobs += [("start", u) for u in names]
        with ThreadPoolExecutor(max_workers=max(len(names), 1)) as pool:
            list(pool.map(self._start_one, names))

    def stop(self, *units: str) -> None:
        expanded = self._expand(units)
        self.stopped |= set(expanded)
        named = tuple(u for u in units if u not in self.targets)
        for unit in expanded:
            if unit not in named and not self._still_stopping(unit):
                # Only PartOf= of a target named alone: stopped behind systemctl's back.
                t = threading.Thread(
                    target=self.procs[unit].stop, args=(STOP_GRACE_S,), daemon=True
                )
                self.stopping[unit] = t
                self.jobs.append(("stop", unit))
                t.start()
        self._each("stop", named, lambda s: s.stop(STOP_GRACE_S))
        for unit in named:
            behind = self.stopping.pop(unit, None)
            if behind is not None:
                behind.join()

    def restart(self, *units: str) -> None:
        self.stop(*units)
        self.start(*units)

    def reset_failed(self, *units: str) -> None:
        self.stopped |= set(self._expand(units))

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        return self.procs[unit].log_text().splitlines()[-lines:]

    def cmdline(self, pid: int) -> list[str]:
        return next((s.argv for s in self.procs.values() if s.proc and s.proc.pid == pid), [])

    def read_file(self, path: str) -> str | None:
        return self.files.get(path)

    def remove_file(self, path: str) -> None:
        self.files.pop(path, None)

    def write_file(self, path: str, text: str) -> None:
        self.files[path] = text

    def daemon_reload(self) -> None:
        """As systemd: each unit's next start runs what its release drop-in says now (none:
        the unit's own environment)."""
        for unit, sim in self.procs.items():
            env = dict(self.base_env[unit])
            text = self.files.get(release.dropin(unit))
            if text is not None:
                r = release.parse(text, f"{self.host}:{release.dropin(unit)}")
                env |= {release.ENV_VAR: r.env, **self.environments.get(r.env, {})}
                if r.model is not None:
                    env[release.MODEL_VAR] = r.model
            sim.env = env


def _instances(p: Local) -> list[TopologyInstance]:
    return [
        TopologyInstance(
            id=f"{host_of(sim)}/{names.instance_name(p.name, role.value, n)}",
            host=host_of(sim),
            name=names.instance_name(p.name, role.value, n),
            pair=p.name,
            role=role,
            unit=names.engine_unit(p.name, role.value, n),
            url=sim.url,
            numa_node=0,
            gpus=[0],
            bootstrap_port=sim.bootstrap_port if role is Role.PREFILL else None,
        )
        for role, n, sim in p.members()
    ]


def _gateway(gateway: Gateway, host: str) -> TopologyGateway:
    return TopologyGateway(
        host=host,
        url=gateway.url,
        metrics_url=f"http://127.0.0.1:{gateway.metrics_port}/metrics",
        unit=names.GATEWAY_UNIT,
    )


def local_topology(
    pairs: Sequence[Local], gateway: Gateway, others: Sequence[Gateway] = ()
) -> Topology:
    """One host; `others` are more gateways (hosts local-2, local-3, ...)."""
    gateways = [
        _gateway(gateway, HOST),
        *(_gateway(g, f"{HOST}-{n}") for n, g in enumerate(others, 2)),
    ]
    members = {p.name: _instances(p) for p in pairs}

    def ids(p: Local, role: Role) -> list[str]:
        return [i.id for i in members[p.name] if i.role is role]

    return Topology(
        model="sim",
        engine="sim",
        instances=[i for p in pairs for i in members[p.name]],
        pairs=[
            TopologyPair(
                host=HOST,
                name=p.name,
                target=p.target,
                prefill=ids(p, Role.PREFILL)[0],
                decode=ids(p, Role.DECODE)[0],
            )
            for p in pairs
            if isinstance(p, LocalPair)
        ],
        groups=[
            TopologyGroup(
                host=None if p.across else HOST,
                name=p.name,
                target=p.target,
                prefill=ids(p, Role.PREFILL),
                decode=ids(p, Role.DECODE),
            )
            for p in pairs
            if isinstance(p, LocalGroup)
        ],
        gateways=gateways,
    )


def local_ops(
    pairs: Sequence[Local],
    gateway: Gateway,
    timeouts: Timeouts | None = None,
    others: Sequence[Gateway] = (),
    coord: TopologyCoord | None = None,
) -> tuple[Ops, LocalUnits]:
    """Ops over local processes on the one pretend host `local`; with `coord` (a local etcd's,
    pdctl.testing.etcd) the topology names it and restarts hold the fleet restart lock in it."""
    ops, units = local_fleet_ops(pairs, gateway, timeouts, others, coord)
    return ops, units[HOST]


def local_fleet_ops(
    pairs: Sequence[Local],
    gateway: Gateway,
    timeouts: Timeouts | None = None,
    others: Sequence[Gateway] = (),
    coord: TopologyCoord | None = None,
) -> tuple[Ops, dict[str, LocalUnits]]:
    """local_ops over the pretend hosts of the engines' addresses (host_of): each host's
    units apart, as each host's systemd is."""
    hosts = dict.fromkeys([HOST, *(host_of(sim) for p in pairs for _, _, sim in p.members())])
    units = {h: LocalUnits(pairs, h) for h in hosts}
    systemd: dict[str, Systemd] = dict(units)
    topo = local_topology(pairs, gateway, others)
    store = None
    if coord is not None:
        topo = topo.model_copy(update={"coord": coord})
        store = Store(coord)
    ops = Ops(
        Source(topo, None),
        systemd.__getitem__,
        [GatewayAdmin(g.url) for g in (gateway, *others)],
        timeouts or Timeouts(health=60, canary=30),
        store=store,
        fleet_lock=RestartLock(store, coord.lock_ttl_s) if store and coord else None,
    )
    return ops, units


def behind_gateway(
    pairs: Sequence[Local], gateway_factory: Callable[..., Gateway]
) -> tuple[Ops, dict[str, LocalUnits]]:
    """`pairs` (their engines started) healthy behind a new round-robin gateway from
    `gateway_factory` (the integration fixture), each registered under its id as pdctl
    registers them; the ops' progress goes to stderr."""
    for sim in (sim for p in pairs for _, _, sim in p.members()):
        sim.wait_healthy(120)  # several engines start at once on a small machine
    gw = gateway_factory([], [], "--policy", "round_robin")
    ops, units = local_fleet_ops(pairs, gw)
    for unit in ops.source.pairs():
        register_pair(ops, unit)
    gw.wait_ready()
    ops.say = lambda line: print(line, file=sys.stderr)
    return ops, units


@contextlib.contextmanager
def serving(
    pairs: Sequence[Local],
    log_dir: Path,
    *gateway_args: str,
    timeouts: Timeouts | None = None,
    bound: bool = True,
) -> Iterator[tuple[Ops, LocalUnits, Gateway]]:
    """`pairs` started behind the real gateway (smg), every process stopped by PID on the way
    out. `bound`: each pair and group registered under its own id as pdctl registers them,
    else its members listed on smg's command line (unbound: smg pairs any with any)."""
    sims = [sim for p in pairs for _, _, sim in p.members()]
    binary = smg_binary()
    if binary is None:
        raise RuntimeError("smg is not installed (scripts/setup.sh installs it into .venv)")
    gw: Gateway | None = None
    try:
        for s in sims:
            s.start()
        for s in sims:
            s.wait_healthy(120)
        listed = [] if bound else [(r, sim) for p in pairs for r, _, sim in p.members()]
        prefills, decodes = ([s for r, s in listed if r is role] for role in Role)
        gw = start_gateway(binary, prefills, decodes, log_dir, *gateway_args)
        ops, units = local_ops(pairs, gw, timeouts)
        for unit in ops.source.pairs() if bound else ():
            register_pair(ops, unit)
        yield ops, units, gw.wait_ready()
    finally:
        if gw is not None:
            gw.stop()
        for s in sims:
            s.stop()


@contextlib.contextmanager
def transfers_read(units: Sequence[LocalUnits]) -> Iterator[list[dict[str, float]]]:
    """Every decode's cross-group counter (pdctl.testing.stack.cross_group_transfers), read
    just before each stop of the hosts' units (the counter dies with the process; the drain
    has let in-flight requests finish by then) and once more on the way out."""
    snapshots: list[dict[str, float]] = []
    decodes = [sim for u in units for sim in u.procs.values() if sim.mode == "decode"]
    for u in units:

        def stop_after_reading(*names: str, stop: Callable[..., None] = u.stop) -> None:
            snapshots.append(cross_group_transfers(decodes))
            stop(*names)

        setattr(u, "stop", stop_after_reading)  # noqa: B010 (mypy: a method is read-only)
    try:
        yield snapshots
    finally:
        for u in units:
            delattr(u, "stop")
        snapshots.append(cross_group_transfers(decodes))
