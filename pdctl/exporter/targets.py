"""What the exporter on one host watches, read from the topology file pdctl uses
(/etc/pdstack/topology.yaml): which engine owns each GPU, the pairs to probe, the decode
engines whose journals to follow. Label values match the Prometheus file_sd labels:
engine = HOST/PAIR-ROLE, pair = HOST/PAIR (a group's id: HOST/GROUP; a group across hosts':
GROUP, watched by the exporter of the host of its first prefill)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pdctl.errors import SpecError
from pdctl.exporter.canary import PairTarget
from pdctl.exporter.journal import JournalTarget
from pdctl.pdclient import legs
from pdctl.spec import Role
from pdctl.topology import Topology, TopologyInstance, read


@dataclass(frozen=True)
class GpuOwner:
    role: str
    numa_node: str
    engine: str
    pair: str


@dataclass(frozen=True)
class DecodeEngine:
    engine: str
    pair: str
    url: str


@dataclass
class HostTargets:
    gpus: dict[int, GpuOwner] = field(default_factory=dict)
    pairs: list[PairTarget] = field(default_factory=list)
    journals: list[JournalTarget] = field(default_factory=list)
    decodes: list[DecodeEngine] = field(default_factory=list)
    # (pair, role) -> members the topology gives that role of the pair or group: what the
    # deployment states, against which its engines' `up` is counted (PDGroupMembersDown).
    members: dict[tuple[str, str], int] = field(default_factory=dict)


def host_targets(topo: Topology, host: str, journal_files: dict[str, Path]) -> HostTargets:
    out = HostTargets()
    by_id = {i.id: i for i in topo.instances}
    for inst in topo.on_host(host):
        pair = topo.pair_id(inst.host, inst.pair)
        for gpu in inst.gpus:
            out.gpus[gpu] = GpuOwner(inst.role.value, str(inst.numa_node), inst.id, pair)
        if inst.role is Role.DECODE:
            out.decodes.append(DecodeEngine(inst.id, pair, inst.url))
            out.journals.append(
                JournalTarget(inst.id, pair, inst.unit, journal_files.get(inst.name))
            )
    units = [(p.host, p.name, [p.prefill], [p.decode]) for p in topo.pairs] + [
        (g.host or _first_host(g.prefill, by_id), g.name, g.prefill, g.decode) for g in topo.groups
    ]
    for unit_host, name, prefill_ids, decode_ids in units:
        label = topo.pair_id(unit_host, name)
        if unit_host == host:
            for role, ids in ((Role.PREFILL, prefill_ids), (Role.DECODE, decode_ids)):
                out.members[(label, role.value)] = len(ids)
        prefills = [by_id[i] for i in prefill_ids if i in by_id]
        decodes = [by_id[i] for i in decode_ids if i in by_id]
        if unit_host != host or not prefills or not decodes:
            continue
        if any(p.bootstrap_port is None for p in prefills):
            continue
        out.pairs.append(
            PairTarget(
                label,
                tuple((p.url, d.url, p.bootstrap_port or 0) for p, d in legs(prefills, decodes)),
            )
        )
    return out


def _first_host(ids: list[str], by_id: dict[str, TopologyInstance]) -> str:
    """A group across hosts is watched once: by the exporter of its first prefill's host."""
    return by_id[ids[0]].host if ids and ids[0] in by_id else ""


class TopologyFile:
    """Re-read when the file changes; after a bad edit the last good topology stays in use
    and the error is reported (pdstack_scrape_success{collector="topology"} 0)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.topology: Topology | None = None
        self.error: str | None = None
        self._stamp: tuple[float, int] | None = None

    def refresh(self) -> Topology | None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
        except OSError as e:
            self.error, self._stamp = f"{self.path}: {e.strerror}", None
            return self.topology
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self.topology, self.error = read(self.path), None
            except SpecError as e:
                self.error = str(e)
        return self.topology
