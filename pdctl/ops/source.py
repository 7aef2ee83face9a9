"""Where the ops commands learn the deployment, and how pair and group names resolve.

On a host: the topology file site.yml writes (/etc/pdstack/topology.yaml). On a controller:
the inventory and profile (-i/-p), which also allow the checks that need the profile
(`validate` rules and flag drift against the rendered launch lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pdctl import pdclient, topology
from pdctl.errors import PdctlError
from pdctl.topology import Topology, TopologyGroup, TopologyInstance, TopologyPair

if TYPE_CHECKING:  # on a host, from the topology file, no profile model is needed
    from pdctl.spec import Deployment


@dataclass(frozen=True)
class Pair:
    """A pair or a group with its instances resolved: the unit of restart and of routing
    (`--pair NAME` names either; a pair has one prefill and one decode)."""

    spec: TopologyPair | TopologyGroup
    prefills: tuple[TopologyInstance, ...]
    decodes: tuple[TopologyInstance, ...]

    @property
    def id(self) -> str:
        """HOST/NAME; NAME for a group across hosts (it exists once in the fleet)."""
        return self.spec.name if self.spec.host is None else f"{self.spec.host}/{self.spec.name}"

    @property
    def hosts(self) -> list[str]:
        """Where its members run, in member order, once each (one host but for a group
        across hosts)."""
        return list(dict.fromkeys(i.host for i in self.instances))

    def on(self, host: str) -> tuple[TopologyInstance, ...]:
        """Its members on `host`."""
        return tuple(i for i in self.instances if i.host == host)

    def names(self, name: str) -> bool:
        """`name` is its id, its name, or (for a group across hosts) HOST/NAME on a host of
        one of its members: the recovery unit of each host names it so."""
        if name in (self.id, self.spec.name):
            return True
        host, _, rest = name.rpartition("/")
        return self.spec.host is None and rest == self.spec.name and host in self.hosts

    @property
    def instances(self) -> tuple[TopologyInstance, ...]:
        return (*self.prefills, *self.decodes)

    def legs(self) -> list[tuple[TopologyInstance, TopologyInstance]]:
        """pdclient.legs: every prefill and every decode on one at least."""
        return pdclient.legs(self.prefills, self.decodes)

    def canary_legs(self) -> list[tuple[str, str, int]]:
        """`legs` as pdclient.group_canary takes them."""
        return [(p.url, d.url, p.bootstrap_port or 0) for p, d in self.legs()]


@dataclass(frozen=True)
class Source:
    topology: Topology
    deployment: Deployment | None  # only from -i/-p

    def pairs(self) -> list[Pair]:
        """Every pair and group, in the topology's instance order (host by host)."""
        topo = self.topology
        by_id = {i.id: i for i in topo.instances}
        units = [Pair(p, (by_id[p.prefill],), (by_id[p.decode],)) for p in topo.pairs] + [
            Pair(g, tuple(by_id[i] for i in g.prefill), tuple(by_id[i] for i in g.decode))
            for g in topo.groups
        ]
        order = {i.id: n for n, i in enumerate(topo.instances)}
        return sorted(units, key=lambda u: order[u.prefills[0].id])

    def select(self, names: tuple[str, ...], all_pairs: bool) -> list[Pair]:
        """The named pairs (NAME or HOST/NAME) in deployment order, or all of them."""
        pairs = self.pairs()
        if all_pairs:
            return pairs
        valid = ", ".join(p.id for p in pairs)
        if not names:
            raise PdctlError(f"name a group with --pair NAME, or use --all (groups: {valid})")
        chosen: list[Pair] = []
        for name in names:
            hits = [p for p in pairs if p.names(name)]
            if not hits:
                raise PdctlError(f"unknown group {name!r}; valid groups: {valid}")
            if len(hits) > 1:
                raise PdctlError(
                    f"group name {name!r} is on several hosts; use one of: "
                    + ", ".join(p.id for p in hits)
                )
            chosen += [h for h in hits if h not in chosen]
        return [p for p in pairs if p in chosen]

    def instance(self, name: str) -> TopologyInstance:
        hits = [i for i in self.topology.instances if name in (i.id, i.name)]
        if len(hits) != 1:
            valid = ", ".join(i.id for i in self.topology.instances)
            what = "ambiguous" if hits else "unknown"
            raise PdctlError(f"{what} instance {name!r}; valid instances: {valid}")
        return hits[0]


def controller_topology(dep: Deployment) -> Topology:
    """The deployment's topology as the controller uses it: the store's TLS files from its
    PKI directory (pdctl etcd pki), not the host paths site.yml installs them at."""
    # Here only: pki needs `cryptography`, which the controller has (ansible-core's) and a
    # host's venv need not.
    from pdctl.coord import pki

    topo = topology.from_deployment(dep)
    if topo.coord is None:
        return topo
    coord = topo.coord.model_copy(update=pki.controller_tls(dep.pki_dir))
    return topo.model_copy(update={"coord": coord})


def load(topology_path: Path, inventory: Path | None, profile: Path | None) -> Source:
    """From -i/-p when given, else the topology file."""
    if inventory is not None:
        from pdctl.spec import load_deployment

        dep = load_deployment(inventory, profile)
        return Source(controller_topology(dep), dep)
    if not topology_path.exists():
        raise PdctlError(
            f"no topology file at {topology_path}: this host was not converged. Run site.yml "
            "(ansible-playbook site.yml), or on a controller pass -i INVENTORY [-p PROFILE]."
        )
    return Source(topology.read(topology_path), None)
