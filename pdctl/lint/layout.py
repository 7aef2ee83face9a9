"""Where instances sit: GPU ids, TP size, NUMA binding, ports."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import hardware_key, instance_key
from pdctl.spec import Deployment, HostSpec, Instance


@rule("gpu-overlap", Severity.ERROR, "a GPU id is given to two instances on one host")
def gpu_overlap(dep: Deployment) -> Iterator[Problem]:
    for host in dep.hosts:
        owners: dict[int, list[str]] = {}
        for inst in host.instances:
            for gpu in inst.gpus:
                owners.setdefault(gpu, []).append(inst.name)
        for gpu, names in sorted(owners.items()):
            if len(names) > 1:
                inst = next(i for i in host.instances if i.name == names[-1])
                yield Problem(
                    where=host.name,
                    message=f"GPU {gpu} is used by {', '.join(names)}: two engines on one GPU "
                    "both size their static pool from the whole GPU and one OOMs at start",
                    fix=f"{instance_key(dep, inst, 'gpus')}: give each instance its own GPUs",
                )


@rule("gpu-out-of-range", Severity.ERROR, "a GPU id is not below the host's gpu_count")
def gpu_out_of_range(dep: Deployment) -> Iterator[Problem]:
    for host in dep.hosts:
        count = host.hardware.gpu_count
        for inst in host.instances:
            bad = [g for g in inst.gpus if g >= count]
            if bad:
                yield Problem(
                    where=inst.id,
                    message=f"GPU ids {bad} do not exist: the host has GPUs 0-{count - 1}",
                    fix=f"{instance_key(dep, inst, 'gpus')} or "
                    f"{hardware_key(dep, host.name, 'gpu_count')}",
                )


@rule("tp-mismatch", Severity.ERROR, "tp differs from the number of GPUs of the instance")
def tp_mismatch(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        if inst.tp != len(inst.gpus):
            effect = (
                "SGLang would look for GPUs it is not given and fail to start"
                if inst.tp > len(inst.gpus)
                else f"{len(inst.gpus) - inst.tp} of its GPUs would sit idle"
            )
            yield Problem(
                where=inst.id,
                message=f"tp {inst.tp} but {len(inst.gpus)} GPUs {list(inst.gpus)}: {effect}",
                fix=f"{instance_key(dep, inst, 'tp')}: drop it (defaults to the GPU count) "
                f"or match {instance_key(dep, inst, 'gpus')}",
            )


def _numa_bound(dep: Deployment) -> Iterator[tuple[HostSpec, dict[int, list[int]], Instance]]:
    """(host, its NUMA topology, instance) for the instances of hosts whose topology is known."""
    for host in dep.hosts:
        if topology := host.hardware.numa_gpus:
            for inst in host.instances:
                yield host, topology, inst


@rule("numa-unknown-node", Severity.ERROR, "numa_node is not a node of the host's numa_gpus")
def numa_unknown_node(dep: Deployment) -> Iterator[Problem]:
    for host, topology, inst in _numa_bound(dep):
        if inst.numa_node not in topology:
            yield Problem(
                where=inst.id,
                message=f"NUMA node {inst.numa_node} is not in the host's topology "
                f"(nodes {sorted(topology)}): numactl --membind fails, the unit never starts",
                fix=f"{instance_key(dep, inst, 'numa_node')} or "
                f"{hardware_key(dep, host.name, 'numa_gpus')}",
            )


@rule("numa-mismatch", Severity.WARNING, "an instance is bound to another NUMA node than its GPUs")
def numa_mismatch(dep: Deployment) -> Iterator[Problem]:
    for host, topology, inst in _numa_bound(dep):
        local = set(topology.get(inst.numa_node, []))
        if inst.numa_node in topology and not set(inst.gpus) <= local:
            far = sorted(set(inst.gpus) - local)
            yield Problem(
                where=inst.id,
                message=f"bound to NUMA node {inst.numa_node} but GPUs {far} hang off another "
                "node: every host-GPU copy and the KV transfer cross the socket link",
                fix=f"{instance_key(dep, inst, 'numa_node')}: the node of its GPUs "
                f"({hardware_key(dep, host.name, 'numa_gpus')})",
            )


@rule("port-collision", Severity.ERROR, "two listeners on one host share a port")
def port_collision(dep: Deployment) -> Iterator[Problem]:
    router, etcd = dep.profile.router, dep.profile.etcd
    instances = {h.name: h.instances for h in dep.hosts}
    for name in dep.inventory_hosts:
        users: dict[int, list[tuple[str, str]]] = {}  # port -> (who, key path)
        for inst in instances.get(name, []):
            users.setdefault(inst.port, []).append(
                (f"{inst.name} HTTP", instance_key(dep, inst, "port"))
            )
            if inst.bootstrap_port is not None:
                users.setdefault(inst.bootstrap_port, []).append(
                    (f"{inst.name} bootstrap", instance_key(dep, inst, "bootstrap_port"))
                )
        if name in {g.name for g in dep.gateways}:
            users.setdefault(router.port, []).append(("router", "router.port"))
            users.setdefault(router.metrics_port, []).append(
                ("router metrics", "router.metrics_port")
            )
        if name in {m.name for m in dep.etcd}:
            for field in ("client_port", "peer_port", "metrics_port"):
                users.setdefault(getattr(etcd, field), []).append(
                    (f"etcd {field.removesuffix('_port')}", f"etcd.{field}")
                )
        for port, who in sorted(users.items()):
            if len(who) > 1:
                yield Problem(
                    where=name,
                    message=f"port {port} is used by {', '.join(w for w, _ in who)}: "
                    "the second listener fails to bind",
                    fix=f"{who[-1][1]}: pick a free port",
                )
