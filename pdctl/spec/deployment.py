"""A validated profile resolved against an inventory: every instance on every host."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pdctl import names
from pdctl.spec.profile import Hardware, Profile, Role, Tuning


@dataclass(frozen=True)
class Instance:
    host: str
    address: str
    pair: str
    role: Role
    numa_node: int
    gpus: tuple[int, ...]
    port: int
    bootstrap_port: int | None
    tp: int
    tuning: Tuning

    @property
    def name(self) -> str:
        return names.instance_name(self.pair, self.role.value)

    @property
    def id(self) -> str:
        """Unique across hosts: pair names repeat on every host of the same layout."""
        return f"{self.host}/{self.name}"

    @property
    def unit(self) -> str:
        return names.engine_unit(self.pair, self.role.value)

    @property
    def pair_target(self) -> str:
        return names.pair_target(self.pair)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str
    hardware: Hardware
    instances: list[Instance]


@dataclass(frozen=True)
class GatewayHost:
    """A host of the inventory's [router] group: each runs a gateway over every pair."""

    name: str
    address: str


@dataclass(frozen=True)
class EtcdMember:
    """A host of the inventory's [etcd] group: one member of the coordination store."""

    name: str
    address: str


@dataclass(frozen=True)
class Deployment:
    profile: Profile
    profile_path: Path
    inventory_path: Path
    hosts: list[HostSpec]
    gateways: list[GatewayHost]  # in inventory order; never empty
    # In inventory order; empty when the inventory has no [etcd] hosts (lint rule etcd-members).
    etcd: list[EtcdMember] = field(default_factory=list)
    # The controller's etcd PKI (CA key included): pdstack_etcd_pki_dir, else <inventory>/pki.
    pki_dir: Path = Path("pki")

    @property
    def router_host(self) -> str:
        """The first gateway's host: the one clients and benchmarks use by default."""
        return self.gateways[0].name

    @property
    def router_address(self) -> str:
        return self.gateways[0].address

    @property
    def instances(self) -> list[Instance]:
        return [i for h in self.hosts for i in h.instances]

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    def pairs(self) -> list[tuple[Instance, Instance]]:
        """(prefill, decode) per pair, in inventory then layout order."""
        by_pair: dict[tuple[str, str], dict[Role, Instance]] = {}
        for inst in self.instances:
            by_pair.setdefault((inst.host, inst.pair), {})[inst.role] = inst
        return [(p[Role.PREFILL], p[Role.DECODE]) for p in by_pair.values()]

    @property
    def router_url(self) -> str:
        return self.gateway_url(self.gateways[0])

    def gateway_url(self, gateway: GatewayHost) -> str:
        return f"http://{gateway.address}:{self.profile.router.port}"

    def etcd_client_url(self, member: EtcdMember) -> str:
        return f"https://{member.address}:{self.profile.etcd.client_port}"

    def etcd_peer_url(self, member: EtcdMember) -> str:
        return f"https://{member.address}:{self.profile.etcd.peer_port}"

    @property
    def etcd_endpoints(self) -> list[str]:
        return [self.etcd_client_url(m) for m in self.etcd]

    @property
    def inventory_hosts(self) -> list[str]:
        """Every host of the deployment's groups, in inventory order, once."""
        names = [h.name for h in self.hosts] + [g.name for g in self.gateways]
        return list(dict.fromkeys(names + [m.name for m in self.etcd]))
