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
    group: str  # its pair's or group's name: the unit of restart and of routing
    role: Role
    # Its number among its group's members of its role; None for a pair's side, which keeps
    # the names pairs always had (pd0-decode).
    member: int | None
    numa_node: int
    gpus: tuple[int, ...]
    port: int
    bootstrap_port: int | None
    tp: int
    tuning: Tuning
    # Its group's members name their hosts: the group exists once in the fleet, its id is
    # its name alone (docs/spec.md, "Groups across hosts").
    placed: bool = False

    @property
    def kind(self) -> str:
        """`pair` or `group`: what its unit file calls the thing it belongs to."""
        return "pair" if self.member is None else "group"

    @property
    def name(self) -> str:
        return names.instance_name(self.group, self.role.value, self.member)

    @property
    def id(self) -> str:
        """Unique across hosts: pair names repeat on every host of the same layout."""
        return f"{self.host}/{self.name}"

    @property
    def unit(self) -> str:
        return names.engine_unit(self.group, self.role.value, self.member)

    @property
    def pair_target(self) -> str:
        return names.pair_target(self.group)

    @property
    def env_file(self) -> str:
        return names.env_file(self.group, self.role.value, self.member)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass(frozen=True)
class Group:
    """The prefills and decodes of one pair or group (a pair: one of each): on one host, or,
    for a group whose members name hosts (`host` None), on those hosts."""

    host: str | None
    name: str
    prefills: tuple[Instance, ...]
    decodes: tuple[Instance, ...]

    @property
    def id(self) -> str:
        """The gateway's pairing protocol for its members (pdctl.ops.gateway): HOST/NAME for
        what repeats on every host, NAME for a group that exists once in the fleet."""
        return self.name if self.host is None else f"{self.host}/{self.name}"

    @property
    def hosts(self) -> list[str]:
        """Where its members run, in member order, once each."""
        return list(dict.fromkeys(i.host for i in self.instances))

    @property
    def is_pair(self) -> bool:
        """Written as a pair (its members keep the pair names)."""
        return self.prefills[0].member is None

    @property
    def is_1p1d(self) -> bool:
        """One prefill and one decode: a pair, or a group written with one of each."""
        return len(self.prefills) == len(self.decodes) == 1

    @property
    def target(self) -> str:
        return names.pair_target(self.name)

    @property
    def instances(self) -> tuple[Instance, ...]:
        return (*self.prefills, *self.decodes)


def _number(inst: Instance) -> int:
    """Members of a group across hosts come host by host; the group lists them by number."""
    return inst.member or 0


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
    def instances(self) -> list[Instance]:
        return [i for h in self.hosts for i in h.instances]

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    def groups(self) -> list[Group]:
        """Every pair and group on every host, in inventory then layout order; a group whose
        members name hosts once, where its first member in that order is."""
        by_group: dict[tuple[str | None, str], dict[Role, list[Instance]]] = {}
        for inst in self.instances:
            key = (None if inst.placed else inst.host, inst.group)
            roles = by_group.setdefault(key, {r: [] for r in Role})
            roles[inst.role].append(inst)
        return [
            Group(host, name, *(tuple(sorted(m[r], key=_number)) for r in Role))
            for (host, name), m in by_group.items()
        ]

    @property
    def peer_ssh_hosts(self) -> list[HostSpec]:
        """The hosts holding members of groups across hosts: each one's recovery and restart
        reach the others over pdstack's own ssh (docs/security.md); none without such groups."""
        spanning = {g.name for g in self.groups() if g.host is None and len(g.hosts) > 1}
        return [h for h in self.hosts if any(i.group in spanning for i in h.instances if i.placed)]

    @property
    def client_url(self) -> str:
        """Where a client sends requests unless told otherwise (pdctl bench, the end-to-end
        tests): any gateway serves every pair, so the first."""
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
