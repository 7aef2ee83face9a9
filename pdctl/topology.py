"""The topology file site.yml writes on every host (/etc/pdstack/topology.yaml).

pdctl on a host reads it instead of the inventory and profile, so it works where Ansible and the
deployment sources are absent. It holds the whole deployment (every host's pairs and the
gateways), because a pair's peer and the gateways may live on other hosts. Every host of the
inventory's [router] group runs a gateway over every pair (`gateways`, all alike).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pdctl import names
from pdctl.errors import PdctlError, SpecError
from pdctl.roles import Role

if TYPE_CHECKING:  # pdctl.spec builds every profile model: a host's topology needs none
    from pdctl.spec import Deployment, Instance

PATH = Path(names.TOPOLOGY_FILE)
VERSION = 1
MAX_BYTES = 4 << 20  # thousands of pairs fit; a larger file is not one site.yml wrote


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopologyInstance(_Frozen):
    id: str
    host: str
    name: str
    pair: str
    role: Role
    unit: str
    url: str
    numa_node: int
    gpus: list[int]
    bootstrap_port: int | None = None
    # The profile's max_running_requests (the decode's running window): pdctl registers it
    # with smg as the worker's label, so smg's PD admission bounds dispatch by it.
    max_running_requests: int | None = None


class TopologyPair(_Frozen):
    host: str
    name: str
    target: str
    prefill: str  # instance ids
    decode: str


class TopologyGroup(_Frozen):
    """A group with more than one prefill or decode (a host-local 1P1D one is listed under
    `pairs`), or one whose members name their hosts: `host` is then None, it exists once in
    the fleet and its id is its name."""

    host: str | None
    name: str
    target: str
    prefill: list[str]  # instance ids
    decode: list[str]


class TopologyGateway(_Frozen):
    host: str
    url: str
    metrics_url: str
    unit: str


class TopologyCoord(_Frozen):
    """The coordination store: every [etcd] member's client URL and the client's TLS files
    (on a host the files site.yml installs; from -i/-p on a controller, its PKI dir's)."""

    endpoints: list[str]  # https://ADDRESS:PORT per [etcd] member, in inventory order
    ca_file: str
    cert_file: str
    key_file: str
    prefix: str = names.ETCD_PREFIX
    lock_ttl_s: float = 15.0  # a restart lock holder that stops renewing loses it after this
    gateway_ttl_s: float = 15.0  # a gateway whose host stops renewing its key is gone after this


class Topology(_Frozen):
    version: int = VERSION
    model: str  # served model name
    engine: str  # sglang | sim
    instances: list[TopologyInstance]
    pairs: list[TopologyPair]
    # Left out of the file when empty, so a pairs-only deployment writes what it always did.
    groups: list[TopologyGroup] = []
    gateways: list[TopologyGateway] = Field(min_length=1)  # in inventory order
    coord: TopologyCoord | None = None  # the etcd store; left out by pdstack before it

    @model_validator(mode="before")
    @classmethod
    def _former_router(cls, data: Any) -> Any:
        """Files written before gateways were a list name the first one `router` too (and
        before there were several, only `router`): both stay readable."""
        if isinstance(data, dict) and "router" in data:
            rest = {k: v for k, v in data.items() if k != "router"}
            gateways = data.get("gateways") or [data["router"]]
            if gateways[0] != data["router"]:
                raise ValueError("gateways must start with router (the first gateway)")
            return {**rest, "gateways": gateways}
        return data

    @model_validator(mode="before")
    @classmethod
    def _former_lock_server(cls, data: Any) -> Any:
        """A file written for the lock server etcd replaced stays readable (without a store
        restarts refuse until site.yml writes the new one)."""
        if isinstance(data, dict) and "lock" in data:
            return {k: v for k, v in data.items() if k != "lock"}
        return data

    def gateway(self, host: str) -> TopologyGateway:
        """The gateway on inventory host `host`."""
        for g in self.gateways:
            if g.host == host:
                return g
        hosts = ", ".join(g.host for g in self.gateways)
        raise PdctlError(f"no gateway on {host!r}; gateways run on: {hosts}")

    def on_host(self, host: str) -> list[TopologyInstance]:
        return [i for i in self.instances if i.host == host]

    def pair_id(self, host: str, pair: str) -> str:
        """The id of `host`'s pair or group `pair` (the gateway's pairing protocol, the `pair`
        label): HOST/PAIR, or the name of a group across hosts."""
        fleet_wide = any(g.host is None and g.name == pair for g in self.groups)
        return pair if fleet_wide else f"{host}/{pair}"


def _instance(inst: Instance) -> TopologyInstance:
    return TopologyInstance(
        id=inst.id,
        host=inst.host,
        name=inst.name,
        pair=inst.group,
        role=inst.role,
        unit=inst.unit,
        url=inst.url,
        numa_node=inst.numa_node,
        gpus=list(inst.gpus),
        bootstrap_port=inst.bootstrap_port,
        max_running_requests=inst.tuning.max_running_requests,
    )


def from_deployment(dep: Deployment) -> Topology:
    metrics_port = dep.profile.router.metrics_port
    gateways = [
        TopologyGateway(
            host=g.name,
            url=dep.gateway_url(g),
            metrics_url=f"http://{g.address}:{metrics_port}/metrics",
            unit=names.GATEWAY_UNIT,
        )
        for g in dep.gateways
    ]
    groups = dep.groups()
    return Topology(
        model=dep.profile.model.served_name,
        engine=dep.profile.engine.kind.value,
        instances=[_instance(i) for i in dep.instances],
        pairs=[
            TopologyPair(
                host=g.host,
                name=g.name,
                target=g.target,
                prefill=g.prefills[0].id,
                decode=g.decodes[0].id,
            )
            for g in groups
            if g.is_1p1d and g.host is not None
        ],
        groups=[
            TopologyGroup(
                host=g.host,
                name=g.name,
                target=g.target,
                prefill=[i.id for i in g.prefills],
                decode=[i.id for i in g.decodes],
            )
            for g in groups
            if not g.is_1p1d or g.host is None
        ],
        gateways=gateways,
        coord=_coord(dep),
    )


def _coord(dep: Deployment) -> TopologyCoord | None:
    """The store as a host sees it: the TLS files site.yml installs (pdctl.ops.source swaps in
    the controller's own for -i/-p)."""
    if not dep.etcd:
        return None
    etcd = dep.profile.etcd
    return TopologyCoord(
        endpoints=dep.etcd_endpoints,
        ca_file=names.ETCD_CA,
        cert_file=names.ETCD_CLIENT_CERT,
        key_file=names.ETCD_CLIENT_KEY,
        lock_ttl_s=etcd.lock_ttl_s,
        gateway_ttl_s=etcd.gateway_ttl_s,
    )


def dump(topo: Topology) -> str:
    header = "# Written by site.yml (pdstack); read by pdctl on this host. Do not edit.\n"
    data = topo.model_dump(mode="json", exclude=set() if topo.groups else {"groups"})
    # An engine whose profile sets no max_running_requests keeps the file it had before the
    # field existed (no change on the host, nothing to restart).
    for inst in data["instances"]:
        if inst["max_running_requests"] is None:
            del inst["max_running_requests"]
    return header + yaml.safe_dump(data, sort_keys=False)


def read(path: Path = PATH) -> Topology:
    """The topology, or a SpecError naming the file and the bad key."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise SpecError(
            str(path), "", f"cannot read: {e.strerror} (site.yml writes it on every host)"
        ) from None
    if len(raw) > MAX_BYTES:
        raise SpecError(str(path), "", f"larger than {MAX_BYTES >> 20} MiB: not a topology file")
    try:
        data = yaml.safe_load(raw.decode())
    except UnicodeDecodeError as e:
        raise SpecError(
            str(path), "", f"not UTF-8 text (byte {e.start}): not a topology file"
        ) from None
    except yaml.YAMLError as e:
        raise SpecError(str(path), "", f"malformed YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "", "a topology file must be a YAML mapping")
    if data.get("version") != VERSION:
        raise SpecError(str(path), "version", f"expected {VERSION}, got {data.get('version')!r}")
    try:
        topo = Topology.model_validate(data)
    except ValidationError as e:
        from pdctl.spec.load import key_path

        first = e.errors()[0]
        raise SpecError(str(path), key_path(first["loc"]), first["msg"]) from None
    _check_pairs(topo, str(path))
    return topo


def _check_pairs(topo: Topology, file: str) -> None:
    """Each pair and group names instances of the file, with the roles it gives them."""
    by_id = {i.id: i for i in topo.instances}
    refs = [
        (f"pairs[{n}].{role.value}", role, getattr(p, role.value))
        for n, p in enumerate(topo.pairs)
        for role in (Role.PREFILL, Role.DECODE)
    ] + [
        (f"groups[{n}].{role.value}[{m}]", role, ref)
        for n, g in enumerate(topo.groups)
        for role in (Role.PREFILL, Role.DECODE)
        for m, ref in enumerate(getattr(g, role.value))
    ]
    for where, role, ref in refs:
        inst = by_id.get(ref)
        if inst is None:
            raise SpecError(
                file,
                where,
                f"names instance {ref!r}, which is not under instances "
                f"(instances: {', '.join(by_id) or 'none'})",
            )
        if inst.role is not role:
            raise SpecError(file, where, f"{ref!r} is a {inst.role.value} instance")
