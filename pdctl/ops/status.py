"""One view of the deployment: units, engines, pair canaries, the gateway's view."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from pdctl.errors import PdctlError
from pdctl.ops import pending
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayError, GatewayWorker
from pdctl.ops.health import EngineProbe, concurrently, probe_engine
from pdctl.ops.source import Pair
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult, gateway_canary, pair_canary
from pdctl.topology import TopologyInstance


@dataclass(frozen=True)
class InstanceStatus:
    instance: TopologyInstance
    unit: UnitStatus | None
    unit_error: str | None
    probe: EngineProbe
    gateway: GatewayWorker | None  # None: not registered


@dataclass(frozen=True)
class PairStatus:
    id: str
    target: str
    canary: CanaryResult
    # routed: both sides ready in the gateway; drained: both engines answer /health but the
    # gateway does not route to the pair (an interrupted restart, a failed one);
    # not routed: out of the gateway with an engine down; None: the gateway did not answer.
    gateway: str | None = None
    pending: str | None = None  # "restart pending: <reason> (since ...)", see ops/pending.py

    @property
    def drained(self) -> bool:
        return self.gateway == "drained"


@dataclass(frozen=True)
class GatewayStatus:
    url: str
    ready: bool
    detail: str
    canary: CanaryResult | None = None  # a request through the gateway (any pair)


@dataclass(frozen=True)
class Status:
    instances: list[InstanceStatus]
    pairs: list[PairStatus]
    gateway: GatewayStatus

    @property
    def healthy(self) -> bool:
        gw = self.gateway
        gateway_ok = gw.ready and gw.canary is not None and gw.canary.ok
        pairs_ok = all(p.canary.ok and not p.drained for p in self.pairs)
        engines_ok = all(
            i.probe.healthy and i.unit is not None and i.unit.active == "active"
            for i in self.instances
        )
        return gateway_ok and pairs_ok and engines_ok


def _unit(ops: Ops, inst: TopologyInstance) -> tuple[UnitStatus | None, str | None]:
    try:
        return ops.systemd(inst.host).show(inst.unit), None
    except PdctlError as e:
        return None, str(e)


def collect(ops: Ops, canary_count: int = 3) -> Status:
    topo = ops.source.topology
    pairs = ops.source.pairs()
    calls: dict[str, Any] = {}
    for inst in topo.instances:
        calls[f"unit:{inst.id}"] = lambda i=inst: _unit(ops, i)
        calls[f"probe:{inst.id}"] = lambda i=inst: probe_engine(i.url)
    for p in pairs:
        calls[f"canary:{p.id}"] = lambda p=p: pair_canary(
            p.prefill.url, p.decode.url, p.prefill.bootstrap_port or 0, canary_count
        )
        calls[f"pending:{p.id}"] = lambda p=p: pending.safe_read(ops.systemd(p.spec.host), p)
    calls["gateway"] = lambda: _gateway(ops)
    got = concurrently(calls)
    gw_status, workers = got["gateway"]
    by_url = {w.url: w for w in workers or []}
    instances = []
    for i in topo.instances:
        unit, unit_error = got[f"unit:{i.id}"]
        instances.append(
            InstanceStatus(i, unit, unit_error, got[f"probe:{i.id}"], by_url.get(i.url))
        )
    return Status(
        instances=instances,
        pairs=[
            PairStatus(
                p.id,
                p.spec.target,
                got[f"canary:{p.id}"],
                None if workers is None else _routing(p, by_url, got),
                pending.describe(*got[f"pending:{p.id}"]),
            )
            for p in pairs
        ],
        gateway=gw_status,
    )


def _routing(pair: Pair, by_url: dict[str, GatewayWorker], got: dict[str, Any]) -> str:
    if all((w := by_url.get(i.url)) and w.status == "ready" for i in pair.instances):
        return "routed"
    up = all(got[f"probe:{i.id}"].healthy for i in pair.instances)
    return "drained" if up else "not routed"


def _gateway(ops: Ops) -> tuple[GatewayStatus, list[GatewayWorker] | None]:
    """The gateway's status and workers (None: it did not list them)."""
    url = ops.source.topology.router.url
    try:
        ready, detail = ops.gateway.readiness()
        canary = gateway_canary(url, ops.gateway.headers)
        return GatewayStatus(url, ready, detail, canary), ops.gateway.workers()
    except GatewayError as e:
        return GatewayStatus(url, False, str(e)), None


def to_json(s: Status) -> dict[str, Any]:
    now = time.time()
    return {
        "healthy": s.healthy,
        "instances": [
            {
                "id": i.instance.id,
                "pair": i.instance.pair,
                "role": i.instance.role.value,
                "unit": i.instance.unit,
                "active": i.unit.active if i.unit else None,
                "sub": i.unit.sub if i.unit else None,
                "pid": i.unit.main_pid if i.unit else None,
                "uptime_s": round(now - i.unit.since) if i.unit and i.unit.since else None,
                "restarts": i.unit.restarts if i.unit else None,
                "unit_error": i.unit_error,
                **{k: v for k, v in asdict(i.probe).items() if k != "url"},
                "url": i.instance.url,
                "gateway": {
                    "status": i.gateway.status,
                    "healthy": i.gateway.healthy,
                    "load": i.gateway.load,
                }
                if i.gateway
                else None,
            }
            for i in s.instances
        ],
        "pairs": [
            {
                "id": p.id,
                "target": p.target,
                "canary": asdict(p.canary),
                "gateway": p.gateway,
                "drained": p.drained,
                "restart_pending": p.pending,
            }
            for p in s.pairs
        ],
        "gateway": asdict(s.gateway),
    }


def _uptime(u: UnitStatus | None) -> str:
    if u is None or u.since is None or u.active != "active":
        return "-"
    s = int(time.time() - u.since)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def tables(s: Status) -> list[Table]:
    t = Table(title="Instances", title_justify="left")
    for col in (
        "instance",
        "unit",
        "PID",
        "uptime",
        "/health",
        "run",
        "queue",
        "KV",
        "graph",
        "tok/s",
        "gateway",
    ):
        t.add_column(
            col, justify="right" if col in ("PID", "run", "queue", "KV", "tok/s") else "left"
        )
    for i in s.instances:
        u, p, g = i.unit, i.probe, i.gateway
        state = f"{u.active}/{u.sub}" if u else f"[red]{i.unit_error}[/]"
        if u and u.active != "active":
            state = f"[red]{state}[/]"
        graph = "-" if p.cuda_graph is None else ("graph" if p.cuda_graph else "[red]eager[/]")
        gw = (
            "[yellow]not registered[/]"
            if g is None
            else (f"{g.status}{'' if g.healthy else ' (unhealthy)'}, load {g.load}")
        )
        t.add_row(
            i.instance.id,
            state,
            str(u.main_pid or "-") if u else "-",
            _uptime(u),
            p.health if p.healthy else f"[red]{p.health}[/]",
            _num(p.running),
            _num(p.queued),
            _num(p.token_usage, "{:.0%}"),
            graph,
            _num(p.gen_throughput, "{:.1f}"),
            gw,
        )
    pt = Table(title="Pairs (a real request through each pair's PD path)", title_justify="left")
    for col in ("pair", "target", "canary", "latency", "gateway"):
        pt.add_column(col)
    for pr in s.pairs:
        c = pr.canary
        verdict = (
            f"ok {c.sent}/{c.sent}" if c.ok else f"[red]FAILED {c.failed}/{c.sent}[/]: {c.error}"
        )
        routing = {
            None: "-",
            "routed": "routed",
            "drained": f"[yellow]drained[/]: pdctl restart --both --pair {pr.id}",
        }.get(pr.gateway, f"[red]{pr.gateway}[/]")
        if pr.pending:
            routing += f"\n[yellow]{pr.pending}[/]"
        pt.add_row(pr.id, pr.target, verdict, _num(c.latency_s, "{:.3f}s"), routing)
    gt = Table(title="Gateway", title_justify="left")
    for col in ("url", "readiness", "request", "latency"):
        gt.add_column(col)
    gc = s.gateway.canary
    gt.add_row(
        s.gateway.url,
        ("ready " if s.gateway.ready else "[red]NOT READY[/] ") + s.gateway.detail,
        "-" if gc is None else "ok" if gc.ok else f"[red]{gc.error}[/]",
        _num(gc.latency_s if gc else None, "{:.3f}s"),
    )
    return [t, pt, gt]
