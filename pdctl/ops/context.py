"""What every ops action needs: the deployment, systemd per host, the gateways, the fleet
restart lock, time limits."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import click

from pdctl.ops.gateway import GatewayAdmin, api_key
from pdctl.ops.lock import FleetLock, FleetLockUnavailable
from pdctl.ops.source import Source
from pdctl.ops.systemd import Systemd, for_host


@dataclass(frozen=True)
class Timeouts:
    drain: float = 60.0  # in-flight requests to finish after the gateway stops routing
    health: float = 900.0  # weights load and CUDA-graph capture take minutes on real models
    canary: float = 120.0
    register: float = 60.0
    poll: float = 0.5


def _echo(line: str) -> None:
    click.echo(line, err=True)


@dataclass
class Ops:
    source: Source
    systemd_for: Callable[[str], Systemd]
    gateway: GatewayAdmin  # the first gateway (topology.router)
    timeouts: Timeouts = field(default_factory=Timeouts)
    canary_count: int = 5
    say: Callable[[str], None] = _echo  # progress lines (stderr, so --format json stays clean)
    other_gateways: list[GatewayAdmin] = field(default_factory=list)  # topology.gateways[1:]
    # The fleet restart lock (topology.lock); None: restarts take only this host's lock.
    fleet_lock: FleetLock | None = None

    @property
    def gateways(self) -> list[GatewayAdmin]:
        """Every gateway: drain and register act on all of them."""
        return [self.gateway, *self.other_gateways]

    def systemd(self, host: str) -> Systemd:
        return self.systemd_for(host)


def host_addresses(source: Source) -> dict[str, str]:
    topo = source.topology
    out = {i.host: urlsplit(i.url).hostname or i.host for i in topo.instances}
    for g in topo.gateways:
        out.setdefault(g.host, urlsplit(g.url).hostname or g.host)
    return out


FLEET_LOCK_ENV = "PDCTL_FLEET_LOCK"  # another lock server's URL than the topology's


def fleet_lock(source: Source, key: str | None) -> FleetLock | None:
    lock = source.topology.lock
    if lock is None:
        return None
    return FleetLock(os.environ.get(FLEET_LOCK_ENV) or lock.url, key, lock.ttl_s)


def restart_lock(ops: Ops, off: bool, warn: Callable[[str], None]) -> FleetLock | None:
    """The fleet lock a restart must hold; None with --no-fleet-lock (`off`), said loudly.
    A topology without one (written before the fleet lock) is refused like an unreachable
    lock server."""
    if off:
        warn(
            "WARNING: --no-fleet-lock: only this host's restart lock is taken; a restart "
            "started elsewhere (another controller, a recovery on another host) may run at "
            "the same time"
        )
        return None
    if ops.fleet_lock is None:
        raise FleetLockUnavailable(
            "the topology names no fleet restart lock (it predates it): run site.yml, which "
            "writes it and installs the lock server; --no-fleet-lock restarts without it"
        )
    return ops.fleet_lock


def real_ops(source: Source, timeouts: Timeouts | None = None) -> Ops:
    """Ops against real hosts: local systemctl here, ssh elsewhere."""
    addresses = host_addresses(source)
    cache: dict[str, Systemd] = {}

    def systemd_for(host: str) -> Systemd:
        if host not in cache:
            cache[host] = for_host(host, addresses.get(host, host))
        return cache[host]

    key = api_key()
    first, *others = (GatewayAdmin(g.url, key) for g in source.topology.gateways)
    return Ops(
        source,
        systemd_for,
        first,
        timeouts or Timeouts(),
        other_gateways=others,
        fleet_lock=fleet_lock(source, key),
    )
