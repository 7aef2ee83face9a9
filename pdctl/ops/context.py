"""What every ops action needs: the deployment, and the seams to the outside, each a Protocol
with its real implementation here (tests hand in fakes): systemd per host, the gateways, the
engines' probes, the canaries; the fleet restart lock, time limits."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pdctl.coord.gateways import Keys as GatewayKeys
from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Store, StoreUnavailable
from pdctl.ops.gateway import Gateway, GatewayAdmin, api_key
from pdctl.ops.health import Canaries, Engines, HttpCanaries, HttpEngines
from pdctl.ops.source import Source
from pdctl.ops.systemd import Systemd, for_host
from pdctl.pdclient import CANARIES_VERIFY
from pdctl.topology import TopologyCoord


@dataclass(frozen=True)
class Timeouts:
    drain: float = 60.0  # in-flight requests to finish after the gateway stops routing
    health: float = 900.0  # weights load and CUDA-graph capture take minutes on real models
    canary: float = 120.0
    register: float = 60.0
    # A roll with a capacity floor and none of its groups out waits this long for the
    # gateways to route to enough groups before it stops (pdctl.ops.roll).
    floor: float = 60.0
    poll: float = 0.5


def to_stderr(line: str) -> None:
    """Progress and warnings: stderr, so that --format json on stdout stays clean."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class Ops:
    source: Source
    systemd_for: Callable[[str], Systemd]
    gateways: list[Gateway]  # every gateway, in the topology's order: drain and register
    timeouts: Timeouts = field(default_factory=Timeouts)
    verify_canaries: int = CANARIES_VERIFY  # requests per leg after a restart's first canary
    say: Callable[[str], None] = to_stderr  # progress lines (stderr, so --format json stays clean)
    # The coordination store (topology.coord): the gateways' liveness keys (a restart goes
    # on without a gateway that is gone), and the fleet restart lock in it; None: restarts
    # take only this host's lock, and every gateway must answer.
    store: GatewayKeys | None = None
    fleet_lock: RestartLock | None = None
    engines: Engines = field(default_factory=HttpEngines)  # /ready, /metrics, in flight
    canaries: Canaries = field(default_factory=HttpCanaries)

    def systemd(self, host: str) -> Systemd:
        return self.systemd_for(host)


def host_addresses(source: Source) -> dict[str, str]:
    topo = source.topology
    out = {i.host: urlsplit(i.url).hostname or i.host for i in topo.instances}
    for g in topo.gateways:
        out.setdefault(g.host, urlsplit(g.url).hostname or g.host)
    return out


# The store at other addresses than the topology's (a tunnel from a controller, a test's
# local etcd): comma-separated client URLs. And another key prefix than pdstack's own (several
# deployments sharing one etcd, each test its own keys).
ETCD_ENDPOINTS_ENV = "PDCTL_ETCD_ENDPOINTS"
ETCD_PREFIX_ENV = "PDCTL_ETCD_PREFIX"


def coord(source: Source) -> TopologyCoord | None:
    """The topology's store, with the environment's overrides."""
    c = source.topology.coord
    if c is None:
        return None
    update: dict[str, object] = {}
    if endpoints := os.environ.get(ETCD_ENDPOINTS_ENV):
        update["endpoints"] = [e.strip() for e in endpoints.split(",") if e.strip()]
    if prefix := os.environ.get(ETCD_PREFIX_ENV):
        update["prefix"] = prefix
    return c.model_copy(update=update) if update else c


NO_STORE = "the topology names no etcd store (it predates it): run site.yml"


def store_of(source: Source) -> tuple[Store, TopologyCoord]:
    """The topology's store and its settings, for the commands that need nothing else (no
    gateway key, no systemd); a topology written before etcd is refused like a store down."""
    c = coord(source)
    if c is None:
        raise StoreUnavailable(NO_STORE)
    return Store(c), c


def restart_lock(ops: Ops, off: bool, warn: Callable[[str], None]) -> RestartLock | None:
    """The fleet lock a restart must hold; None with --no-fleet-lock (`off`), said loudly.
    A topology without a store (written before etcd) is refused like an unreachable store."""
    if off:
        warn(
            "WARNING: --no-fleet-lock: only this host's restart lock is taken; a restart "
            "started elsewhere (another controller, a recovery on another host) may run at "
            "the same time"
        )
        return None
    if ops.fleet_lock is None:
        raise StoreUnavailable(
            f"{NO_STORE}, which installs etcd on the [etcd] hosts and writes it; "
            "--no-fleet-lock restarts without it"
        )
    return ops.fleet_lock


def real_ops(
    source: Source, timeouts: Timeouts | None = None, ssh_config: str | None = None
) -> Ops:
    """Ops against real hosts: local systemctl here, ssh elsewhere (with the `ssh_config`
    file, default $PDCTL_SSH_CONFIG: systemd.ssh_config)."""
    addresses = host_addresses(source)
    cache: dict[str, Systemd] = {}

    def systemd_for(host: str) -> Systemd:
        if host not in cache:
            cache[host] = for_host(host, addresses.get(host, host), ssh_config)
        return cache[host]

    key = api_key()
    c = coord(source)
    st = Store(c) if c else None
    return Ops(
        source,
        systemd_for,
        [GatewayAdmin(g.url, key) for g in source.topology.gateways],
        timeouts or Timeouts(),
        store=st,
        fleet_lock=RestartLock(st, c.lock_ttl_s) if st and c else None,
    )
