"""Fakes for the seams of pdctl.ops (pdctl.ops.context.Ops): systemd, the gateways, the engines'
probes and the canaries, and the topology they run over. Tests hand them to Ops instead of
patching the modules that use the real ones."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pdctl.coord import gateways as liveness
from pdctl.coord.lock import Holder
from pdctl.coord.store import Entry, StoreUnavailable
from pdctl.ops import gateway
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import Canaries, EngineProbe, Engines, Leg
from pdctl.ops.source import Source
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult
from pdctl.topology import Topology

OK = CanaryResult(True, 1, 0, 0.01)


def topo(hosts: tuple[str, ...] = ("node-a",), pairs: tuple[str, ...] = ("pd0", "pd1")) -> Topology:
    """`pairs` on each of `hosts` (engines at 10.0.H.1:30000+10n+r), a gateway on the first."""
    instances, pair_specs = [], []
    for h, host in enumerate(hosts):
        for n, name in enumerate(pairs):
            ids = {}
            for r, role in enumerate(("prefill", "decode")):
                ids[role] = f"{host}/{name}-{role}"
                instances.append(
                    {
                        "id": ids[role],
                        "host": host,
                        "name": f"{name}-{role}",
                        "pair": name,
                        "role": role,
                        "unit": f"pdstack-{name}-{role}.service",
                        "url": f"http://10.0.{h}.1:{30000 + 10 * n + r}",
                        "numa_node": 0,
                        "gpus": [r],
                        "bootstrap_port": 8998 + n if role == "prefill" else None,
                    }
                )
            pair_specs.append(
                {"host": host, "name": name, "target": f"pdstack-{name}.target", **ids}
            )
    return Topology.model_validate(
        {
            "model": "sim",
            "engine": "sim",
            "instances": instances,
            "pairs": pair_specs,
            "gateways": [
                {
                    "host": hosts[0],
                    "url": "http://10.0.0.1:8000",
                    "metrics_url": "http://10.0.0.1:29000/metrics",
                    "unit": "pdstack-gateway.service",
                }
            ],
        }
    )


class FakeSystemd:
    host = "node-a"

    def __init__(self, fail_start: Collection[str] = ()) -> None:
        self.jobs: list[tuple[str, tuple[str, ...]]] = []
        self.fail_start = fail_start
        self.files: dict[str, str] = {}

    def show(self, unit: str) -> UnitStatus:
        active = "failed" if unit in self.fail_start else "active"
        return UnitStatus(unit, "loaded", active, "x", 0 if active == "failed" else 7, None, 0, [])

    def start(self, *units: str) -> None:
        self.jobs.append(("start", units))

    def stop(self, *units: str) -> None:
        self.jobs.append(("stop", units))

    def restart(self, *units: str) -> None:
        self.jobs.append(("restart", units))

    def reset_failed(self, *units: str) -> None:
        self.jobs.append(("reset-failed", units))

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        return [f"{unit}: RuntimeError: CUDA out of memory"]

    def cmdline(self, pid: int) -> list[str]:
        return []

    def read_file(self, path: str) -> str | None:
        return self.files.get(path)

    def remove_file(self, path: str) -> None:
        self.files.pop(path, None)

    def write_file(self, path: str, text: str) -> None:
        self.files[path] = text

    def daemon_reload(self) -> None:
        self.jobs.append(("daemon-reload", ()))


class FakeGateway:
    """Lists nothing, takes every add and remove (recorded in `calls`), answers readiness from
    its third call on (a gateway restarting) and every request through it."""

    # The real registration and wait, over the fake listing and add below.
    register = gateway.GatewayAdmin.register
    wait_answering = gateway.GatewayAdmin.wait_answering

    def __init__(self, url: str = "http://gw:8000") -> None:
        self.url = url
        self.calls: list[str] = []

    def remove(self, urls: Iterable[str]) -> None:
        self.calls += [f"remove {u}" for u in urls]

    def add(
        self,
        url: str,
        kind: str,
        port: int | None = None,
        pairing: str | None = None,
        running_window: int | None = None,
    ) -> None:
        self.calls.append(f"add {url} pairing {pairing}")

    def wait(self, pred: Any, timeout: float, step: float = 0.25) -> bool:
        return True

    def workers(self) -> list[GatewayWorker]:
        return []

    def readiness(self) -> tuple[bool, str]:
        self.calls.append("readiness")
        if self.calls.count("readiness") < 3:  # not listening yet while it restarts
            raise gateway.GatewayError("connection refused")
        return True, "ready"

    def reachable(self, connect_s: float) -> bool:
        self.calls.append(f"reachable {connect_s:g}s")
        return True

    def canary(self) -> CanaryResult:
        return OK


class Listing(FakeGateway):
    """Ready at once, listing `held`."""

    def __init__(self, url: str = "http://gw:8000", held: Iterable[GatewayWorker] = ()) -> None:
        super().__init__(url)
        self.held = list(held)

    def readiness(self) -> tuple[bool, str]:
        return True, "ready"

    def workers(self) -> list[GatewayWorker]:
        return self.held


class Unreachable(FakeGateway):
    """Answers no call with its worker list (GatewayAdmin.remove reads the list first)."""

    def workers(self) -> list[GatewayWorker]:
        raise gateway.GatewayError(f"gateway {self.url}: ConnectionError: refused")

    def remove(self, urls: Iterable[str]) -> None:
        self.workers()


class Silent(FakeGateway):
    """Takes no connection (its host is powered off): every call is recorded in `calls`, then
    fails as GatewayAdmin's do."""

    def _none(self, what: str) -> gateway.GatewayUnreachable:
        self.calls.append(what)
        return gateway.GatewayUnreachable(f"gateway {self.url}: ConnectTimeout: timed out")

    def workers(self) -> list[GatewayWorker]:
        raise self._none("workers")

    def remove(self, urls: Iterable[str]) -> None:
        raise self._none("remove")

    def readiness(self) -> tuple[bool, str]:
        raise self._none("readiness")

    def reachable(self, connect_s: float) -> bool:
        self.calls.append(f"reachable {connect_s:g}s")
        return False


class FakeKeys:
    """The gateways' liveness keys in etcd (pdctl.coord.gateways.Keys): held by the hosts in
    `held`, or by `then` from the second read on; StoreUnavailable when `down`."""

    def __init__(self, held: Iterable[str], then: Iterable[str] | None = None, down: bool = False):
        self.held, self.then, self.down = set(held), then, down
        self.reads = 0

    def list(self, prefix: str, *, serializable: bool = False) -> list[Entry]:
        assert prefix == liveness.PREFIX and serializable
        self.reads += 1
        if self.down:
            raise StoreUnavailable("cannot read: etcd has no quorum: 1 of 3 members answer")
        hosts = self.held if self.reads == 1 or self.then is None else set(self.then)
        return [
            Entry(
                liveness.PREFIX + h,
                liveness.GatewayKey(host=h, url="http://x", since=0).model_dump_json().encode(),
                1,
                1,
                7,
            )
            for h in sorted(hosts)
        ]


def _ok(url: str) -> EngineProbe:
    return EngineProbe(url, "ok")


def _idle(url: str) -> int | None:
    return 0


@dataclass
class FakeEngines:
    """Each engine's probe from `probe_of` (healthy by default) and its in-flight count from
    `held` (none by default)."""

    probe_of: Callable[[str], EngineProbe] = _ok
    held: Callable[[str], int | None] = _idle
    probed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def probe(self, url: str) -> EngineProbe:
        self.probed.append(url)
        return self.probe_of(url)

    def ready(self, url: str) -> EngineProbe:
        return self.probe(url)

    def in_flight(self, url: str) -> int | None:
        return self.held(url)

    def abort_all(self, url: str) -> bool:
        self.aborted.append(url)
        return True


def _passes(count: int) -> CanaryResult:
    return OK


@dataclass
class FakeCanaries:
    """Every canary answers `answer(count)` (passing by default); `legs` records each leg
    sent down."""

    answer: Callable[[int], CanaryResult] = _passes
    legs: list[tuple[str, str]] = field(default_factory=list)

    def pair(
        self, prefill: str, decode: str, bootstrap_port: int, count: int, timeout: float
    ) -> CanaryResult:
        self.legs.append((prefill, decode))
        return self.answer(count)

    def group(self, legs: list[Leg], count: int) -> CanaryResult:
        self.legs += [(p, d) for p, d, _ in legs]
        return self.answer(count)


def fake_ops(
    sd: FakeSystemd,
    gw: FakeGateway,
    *others: FakeGateway,
    engines: Engines | None = None,
    canaries: Canaries | None = None,
    t: Topology | None = None,
) -> Ops:
    """Ops over `t` (topo() by default) with a gateway per fake, the first on the topology's
    gateway host, the others on hosts router-2, router-3, ..."""
    t = t or topo()
    first = t.gateways[0]
    more = [
        first.model_copy(update={"host": f"router-{n}", "url": o.url})
        for n, o in enumerate(others, 2)
    ]
    return Ops(
        Source(t.model_copy(update={"gateways": [first, *more]}), None),
        lambda _h: sd,
        [gw, *others],
        Timeouts(health=0.3, canary=0.3, poll=0.01),
        say=lambda _l: None,
        engines=engines or FakeEngines(),
        canaries=canaries or FakeCanaries(),
    )


LONG_HOSTS = ("gpu-node-017.dc1.example.com", "gpu-node-018.dc1.example.com")


def fleet_status(lock_holder: Holder | None = None) -> Status:
    """Two hosts with long names, two pairs each: one engine down, one pair's canary failing,
    one drained, one engine not registered."""
    t = topo(hosts=LONG_HOSTS, pairs=("pd0", "pd1"))
    insts = []
    for n, inst in enumerate(t.instances):
        unit = UnitStatus(
            inst.unit, "loaded", "active", "running", 1234567, time.time() - 4000, 0, []
        )
        probe = EngineProbe(inst.url, "ok", 3, 0, 0.25, True, 1234.5)
        if n == 3:  # one engine down, with the long error a refused connection gives
            probe = EngineProbe(inst.url, "unreachable (ConnectionError: [Errno 111] refused)")
        worker = GatewayWorker("id", inst.url, inst.role.value, "ready", True, 0)
        insts.append(InstanceStatus(inst, unit, None, probe, (None if n == 5 else worker,)))
    ok = CanaryResult(True, 3, 0, 0.05)
    bad = CanaryResult(False, 3, 2, None, "decode answered HTTP 500: [internal] KV transfer failed")
    pairs = [
        PairStatus(
            p.host + "/" + p.name,
            p.target,
            bad if n == 1 else ok,
            "drained" if n == 2 else "routed",
        )
        for n, p in enumerate(t.pairs)
    ]
    gw = GatewayStatus("http://gateway.dc1.example.com:8000", True, "ready", ok)
    held = {w.url: w for i in insts for w in i.workers if w}
    return Status(insts, pairs, [gw], lock_holder, views={gw.url: held})
