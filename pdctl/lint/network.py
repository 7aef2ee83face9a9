"""KV transfer over RDMA: the transport must be told which NICs to use."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import hardware_key
from pdctl.lint.launch_line import flag_values
from pdctl.render import environment, launch_args
from pdctl.spec import Deployment, HostSpec, Instance


def _rdma_hosted(dep: Deployment, backend: str) -> Iterator[tuple[HostSpec, list[str], Instance]]:
    """(host, its RDMA NICs, instance) for the instances of hosts with RDMA NICs, when `backend`
    moves the KV."""
    if dep.profile.engine.transfer_backend != backend:
        return
    for host in dep.hosts:
        if nics := host.hardware.rdma_nics:
            for inst in host.instances:
                yield host, nics, inst


def _ucx_fix(dep: Deployment, host: HostSpec, nics: list[str]) -> str:
    return (
        f"engine.common.env.UCX_NET_DEVICES: {','.join(f'{n}:1' for n in nics)} "
        f"(see {hardware_key(dep, host.name, 'rdma_nics')})"
    )


@rule("nixl-ucx-devices", Severity.ERROR, "NIXL on a host with RDMA NICs but no UCX_NET_DEVICES")
def nixl_ucx_devices(dep: Deployment) -> Iterator[Problem]:
    for host, nics, inst in _rdma_hosted(dep, "nixl"):
        if "UCX_NET_DEVICES" not in environment(inst, dep):
            yield Problem(
                where=inst.id,
                message=f"the host has RDMA NICs {nics} but UCX_NET_DEVICES is unset: NIXL "
                "ignores --disaggregation-ib-device, UCX may pick a wrong device and "
                "transfers hang until the 300 s timeout",
                fix=_ucx_fix(dep, host, nics),
            )


@rule(
    "ucx-unknown-device",
    Severity.WARNING,
    "UCX_NET_DEVICES names an RDMA device the host's facts do not list",
)
def ucx_unknown_device(dep: Deployment) -> Iterator[Problem]:
    """UCX refuses a device it cannot open and NIXL's UCX backend then fails to start
    (NIXL_ERR_BACKEND), so the engine dies at start-up. Only `device:port` entries (the RDMA
    form) are checked, and only on hosts whose facts list RDMA NICs: network interfaces
    (eth0, lo) are not in the facts."""
    for host, nics, inst in _rdma_hosted(dep, "nixl"):
        devices = environment(inst, dep).get("UCX_NET_DEVICES", "")
        unknown = [
            d.strip()
            for d in devices.split(",")
            if ":" in d and d.strip().split(":")[0] not in nics
        ]
        if unknown:
            yield Problem(
                where=inst.id,
                message=f"UCX_NET_DEVICES={devices} names {', '.join(unknown)}, which the "
                f"host's RDMA NICs {nics} do not include: UCX cannot open it and the "
                "engine exits at start-up (NIXL_ERR_BACKEND)",
                fix=_ucx_fix(dep, host, nics),
            )


@rule(
    "mooncake-ib-device",
    Severity.WARNING,
    "mooncake on a host with RDMA NICs but no --disaggregation-ib-device",
)
def mooncake_ib_device(dep: Deployment) -> Iterator[Problem]:
    for _, nics, inst in _rdma_hosted(dep, "mooncake"):
        if "--disaggregation-ib-device" not in flag_values(launch_args(inst, dep)):
            yield Problem(
                where=inst.id,
                message=f"the host has RDMA NICs {nics} but --disaggregation-ib-device is not "
                "given: mooncake then chooses a device itself, possibly one across the socket",
                fix=f"engine.common.extra_args: add --disaggregation-ib-device {','.join(nics)}",
            )


WILDCARDS = ("0.0.0.0", "::")


@rule(
    "router-host-shared",
    Severity.ERROR,
    "several [router] hosts, each to bind one specific router.host address",
)
def router_host_shared(dep: Deployment) -> Iterator[Problem]:
    host = dep.profile.router.host
    if len(dep.gateways) < 2 or host in WILDCARDS:
        return
    yield Problem(
        where="profile",
        message=f"router.host {host} is one address, but every [router] host "
        f"({', '.join(g.name for g in dep.gateways)}) runs a gateway bound to it: the "
        "gateways on the hosts that do not own it fail to start",
        fix="router.host: 0.0.0.0 (each gateway listens on its own host's addresses)",
    )


@rule(
    "group-tcp-kv",
    Severity.WARNING,
    "a group across hosts moves KV over TCP (allow_tcp_kv: true)",
)
def group_tcp_kv(dep: Deployment) -> Iterator[Problem]:
    for n, group in enumerate(dep.profile.layout.groups):
        if group.allow_tcp_kv and len(group.hosts()) > 1:
            yield Problem(
                where=group.name,
                message=f"group {group.name!r} spans {', '.join(group.hosts())} with "
                "allow_tcp_kv: every request's KV crosses hosts over TCP: at 10-25 Gb/s a "
                "long prompt's KV (GBs) takes seconds, not the tens of ms RDMA takes, and "
                "TTFT grows with it",
                fix=f"layout.groups[{n}]: give its hosts RDMA (hardware.rdma_nics, "
                "UCX_NET_DEVICES) and drop allow_tcp_kv, or keep the group on one host",
            )
