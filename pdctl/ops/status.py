"""One view of the deployment, collected: units, engines, pair canaries, every gateway's view,
the restart lock. pdctl.cli.status_view shows it (a terminal's table, JSON)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pdctl import names
from pdctl.coord import restarts
from pdctl.errors import PdctlError
from pdctl.ops import lock, pending
from pdctl.ops.context import Ops
from pdctl.ops.gateway import Gateway, GatewayError, GatewayWorker
from pdctl.ops.health import EngineProbe
from pdctl.ops.source import Pair
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CANARIES_STATUS, CanaryResult
from pdctl.topology import TopologyInstance

# Probes in flight at once. Status makes 2 per instance (unit, engine), 1 per pair (canary),
# 1 for the gateway and 1 for the lock: 32 covers a 3-host, 12-pair fleet in one wave, so the
# wall time is the slowest probe's, while ssh stays under sshd's MaxStartups (10 per host).
PROBE_WORKERS = 32


@dataclass(frozen=True)
class InstanceStatus:
    instance: TopologyInstance
    unit: UnitStatus | None
    unit_error: str | None
    probe: EngineProbe
    # Its entry at each gateway that listed its workers, in Status.views' order; None: not
    # registered there.
    workers: tuple[GatewayWorker | None, ...]
    # Its pair's or group's id when that is not HOST/PAIR: a group across hosts' name.
    fleet_id: str | None = None

    @property
    def pair_id(self) -> str:
        return self.fleet_id or f"{self.instance.host}/{self.instance.pair}"

    @property
    def state(self) -> str:
        """What it does with new work: ready; paused (/pause_generation: it holds requests
        until /continue_generation); draining (SIGTERM'd, its unit deactivating: it refuses
        new work and finishes what it holds); not ready (starting, failed its last health
        check, down)."""
        if self.probe.paused:
            return "paused"
        if self.unit is not None and self.unit.active == "deactivating":
            return "draining"
        return "ready" if self.probe.healthy else "not ready"


@dataclass(frozen=True)
class PairStatus:
    id: str
    target: str
    canary: CanaryResult
    # routed: both sides ready in every gateway that answers; drained: both engines answer
    # /health but a gateway does not route to the pair (an interrupted restart, a failed one);
    # not routed: out of a gateway with an engine down; None: no gateway answered.
    gateway: str | None = None
    pending: str | None = None  # "restart pending: <reason> (since ...)", see ops/pending.py
    recovery: str | None = None  # "recovery waiting: <why>" while its recovery waits
    # "abandoned restart of X at phase P by H PID N (since T)": its restarter died half-way
    abandoned: str | None = None
    # Member instance ids per role; a pair (1P1D) has one of each.
    prefills: tuple[str, ...] = ()
    decodes: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return self.gateway == "drained"

    @property
    def is_group(self) -> bool:
        """More than one member of a role, or across hosts (its id has no host): shown and
        listed with its members (a host-local 1P1D group is a pair, as in the topology file)."""
        return len(self.prefills) > 1 or len(self.decodes) > 1 or "/" not in self.id

    @property
    def shape(self) -> str:
        return f"{len(self.prefills)}P{len(self.decodes)}D"


@dataclass(frozen=True)
class GatewayStatus:
    url: str
    ready: bool
    detail: str
    canary: CanaryResult | None = None  # a request through the gateway (any pair)
    # Its view of the pairs' workers: "4/4 ready, 4 bound" (bound: the pair's pairing protocol)
    view: str = "-"

    @property
    def ok(self) -> bool:
        return self.ready and self.canary is not None and self.canary.ok


@dataclass(frozen=True)
class Status:
    instances: list[InstanceStatus]
    pairs: list[PairStatus]
    gateways: list[GatewayStatus]  # in the topology's order
    lock: lock.Holder | None = None  # who holds the restart lock; None: free (or unreadable)
    lock_error: str | None = None
    lock_store: str | None = None  # where the fleet restart lock lives; None: this host's lock
    # Every gateway that listed its workers, in the topology's order: URL -> its workers by
    # URL (doctor checks each one's bindings). Empty: no gateway listed them, so registration
    # is unknown.
    views: dict[str, dict[str, GatewayWorker]] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        gateway_ok = all(g.ok for g in self.gateways)
        pairs_ok = all(p.canary.ok and not p.drained and not p.abandoned for p in self.pairs)
        engines_ok = all(
            i.probe.healthy and i.unit is not None and i.unit.active == "active"
            for i in self.instances
        )
        return gateway_ok and pairs_ok and engines_ok


def _unit(ops: Ops, inst: TopologyInstance) -> tuple[UnitStatus | None, str | None]:
    try:
        return ops.systemd(inst.host).show(inst.unit), None
    except PdctlError as e:
        return None, str(e)


def collect(ops: Ops, canary_count: int = CANARIES_STATUS) -> Status:
    topo = ops.source.topology
    pairs = ops.source.pairs()
    # Every probe at once, each kept as a typed future beside what it probes.
    with ThreadPoolExecutor(max_workers=PROBE_WORKERS) as pool:
        units = {i.id: pool.submit(_unit, ops, i) for i in topo.instances}
        probes = {i.id: pool.submit(ops.engines.probe, i.url) for i in topo.instances}
        canaries = {
            p.id: pool.submit(ops.canaries.group, p.canary_legs(), canary_count) for p in pairs
        }
        markers = {p.id: pool.submit(_pending, ops, p) for p in pairs}
        recoveries = {p.id: pool.submit(_recovery, ops, p) for p in pairs}
        answers = [pool.submit(_gateway, gw, pairs) for gw in ops.gateways]
        held = pool.submit(_lock, ops)
        left = pool.submit(_abandoned, ops)
    engines = {k: f.result() for k, f in probes.items()}
    gateways = [f.result() for f in answers]
    # Each answering gateway's workers by URL: a pair is routed when every one routes it, and
    # a gateway that is down (its host lost) leaves the others' view.
    views = [(g.url, {w.url: w for w in workers}) for g, workers in gateways if workers is not None]
    instances = [
        InstanceStatus(
            i,
            *units[i.id].result(),
            engines[i.id],
            tuple(v.get(i.url) for _, v in views),
            i.pair if topo.pair_id(i.host, i.pair) == i.pair else None,
        )
        for i in topo.instances
    ]
    holder, lock_error = held.result()
    abandoned = left.result()
    return Status(
        instances=instances,
        pairs=[
            PairStatus(
                p.id,
                p.spec.target,
                canaries[p.id].result(),
                _routing(p, [v for _, v in views], engines) if views else None,
                pending.describe(*markers[p.id].result()),
                recoveries[p.id].result(),
                abandoned.get(p.id),
                tuple(i.id for i in p.prefills),
                tuple(i.id for i in p.decodes),
            )
            for p in pairs
        ],
        gateways=[g for g, _ in gateways],
        lock=holder,
        lock_error=lock_error,
        lock_store=ops.fleet_lock.store.describe() if ops.fleet_lock else None,
        views=dict(views),
    )


def _pending(ops: Ops, pair: Pair) -> tuple[pending.Pending | None, str | None]:
    """The first of its hosts' markers (a group across hosts has one per changed host)."""
    found: tuple[pending.Pending | None, str | None] = (None, None)
    for host in pair.hosts:
        found = pending.safe_read(ops.systemd(host), pair)
        if found != (None, None):
            return found
    return found


def _recovery(ops: Ops, pair: Pair) -> str | None:
    """What the pair's recovery says while it runs (pdctl recover's sd_notify STATUS=), on
    any of its hosts (a crash on a group's host starts the recovery there)."""
    for host in pair.hosts:
        try:
            u = ops.systemd(host).show(names.recover_unit(pair.spec.name))
        except PdctlError:
            continue  # the host's units are reported unreachable with its engines
        if u.active in ("activating", "active") and u.status_text:
            return u.status_text
    return None


def _abandoned(ops: Ops) -> dict[str, str]:
    """Restarts whose restarter died half-way, by target (none without etcd, or when it
    cannot answer: the lock's line says why)."""
    if ops.fleet_lock is None:
        return {}
    try:
        return {a.record.target: a.describe() for a in restarts.abandoned(ops.fleet_lock.store)}
    except PdctlError:
        return {}


def _lock(ops: Ops) -> tuple[lock.Holder | None, str | None]:
    """The fleet restart lock's holder when the topology has one, else this host's."""
    try:
        return (ops.fleet_lock.holder() if ops.fleet_lock else lock.holder()), None
    except PdctlError as e:
        return None, str(e)


def _routing(
    pair: Pair, views: list[dict[str, GatewayWorker]], engines: dict[str, EngineProbe]
) -> str:
    if all(
        (w := by_url.get(i.url)) and w.status == "ready" for by_url in views for i in pair.instances
    ):
        return "routed"
    up = all(engines[i.id].healthy for i in pair.instances)
    return "drained" if up else "not routed"


def _gateway(gw: Gateway, pairs: list[Pair]) -> tuple[GatewayStatus, list[GatewayWorker] | None]:
    """A gateway's status and workers (None: it did not list them)."""
    try:
        ready, detail = gw.readiness()
        canary = gw.canary()
        workers = gw.workers()
    except GatewayError as e:
        return GatewayStatus(gw.url, False, str(e)), None
    pairing = {i.url: p.id for p in pairs for i in p.instances}
    ours = [w for w in workers if w.url in pairing]
    up = sum(w.status == "ready" and w.healthy for w in ours)
    bound = sum(w.pairing == pairing[w.url] for w in ours)
    view = f"{up}/{len(pairing)} ready, {bound} bound"
    return GatewayStatus(gw.url, ready, detail, canary, view), workers
