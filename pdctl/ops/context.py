"""What every ops action needs: the deployment, systemd per host, the gateway, time limits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import click

from pdctl.ops.gateway import GatewayAdmin, api_key
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
    return Ops(source, systemd_for, first, timeouts or Timeouts(), other_gateways=others)
