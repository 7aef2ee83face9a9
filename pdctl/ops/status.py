"""One view of the deployment: units, engines, pair canaries, every gateway's view, the restart
lock; and its rendering for a terminal, per host and pair, that fits 80 columns."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.text import Text

from pdctl import names
from pdctl.errors import PdctlError
from pdctl.ops import lock, pending
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayAdmin, GatewayError, GatewayWorker
from pdctl.ops.health import EngineProbe, concurrently, probe_engine
from pdctl.ops.source import Pair
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CANARIES_STATUS, CanaryResult, gateway_canary, group_canary
from pdctl.topology import TopologyInstance

# Probes in flight at once. Status makes 2 per instance (unit, engine), 1 per pair (canary),
# 1 for the gateway and 1 for the lock: 32 covers a 3-host, 12-pair fleet in one wave, so the
# wall time is the slowest probe's, while ssh stays under sshd's MaxStartups (10 per host).
PROBE_WORKERS = 32


@dataclass(frozen=True)
class InstanceStatus:
    instance: TopologyInstance
    unit: UnitStatus | None
    unit_error: str | None
    probe: EngineProbe
    gateway: GatewayWorker | None  # at Status.viewed_from; None: not registered there


@dataclass(frozen=True)
class PairStatus:
    id: str
    target: str
    canary: CanaryResult
    # routed: both sides ready in every gateway that answers; drained: both engines answer
    # /health but a gateway does not route to the pair (an interrupted restart, a failed one);
    # not routed: out of a gateway with an engine down; None: no gateway answered.
    gateway: str | None = None
    pending: str | None = None  # "restart pending: <reason> (since ...)", see ops/pending.py
    recovery: str | None = None  # "recovery waiting: <why>" while its recovery waits
    # Member instance ids per role; a pair (1P1D) has one of each.
    prefills: tuple[str, ...] = ()
    decodes: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return self.gateway == "drained"

    @property
    def is_group(self) -> bool:
        """More than one member of a role: shown and listed with its members (a 1P1D group is
        a pair, as in the topology file)."""
        return len(self.prefills) > 1 or len(self.decodes) > 1

    @property
    def shape(self) -> str:
        return f"{len(self.prefills)}P{len(self.decodes)}D"


@dataclass(frozen=True)
class GatewayStatus:
    url: str
    ready: bool
    detail: str
    canary: CanaryResult | None = None  # a request through the gateway (any pair)
    # Its view of the pairs' workers: "4/4 ready, 4 bound" (bound: the pair's pairing protocol)
    view: str = "-"

    @property
    def ok(self) -> bool:
        return self.ready and self.canary is not None and self.canary.ok


@dataclass(frozen=True)
class Status:
    instances: list[InstanceStatus]
    pairs: list[PairStatus]
    gateways: list[GatewayStatus]  # in the topology's order
    lock: lock.Holder | None = None  # who holds the restart lock; None: free (or unreadable)
    lock_error: str | None = None
    lock_store: str | None = None  # where the fleet restart lock lives; None: this host's lock
    # The gateway whose worker list the instances show (the first that listed its workers);
    # None: no gateway listed them, so registration is unknown.
    viewed_from: str | None = None
    # Every gateway that listed its workers, in the topology's order: URL -> its workers by
    # URL (doctor checks each one's bindings; viewed_from is the first).
    views: dict[str, dict[str, GatewayWorker]] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        gateway_ok = all(g.ok for g in self.gateways)
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


def collect(ops: Ops, canary_count: int = CANARIES_STATUS) -> Status:
    topo = ops.source.topology
    pairs = ops.source.pairs()
    calls: dict[str, Any] = {}
    for inst in topo.instances:
        calls[f"unit:{inst.id}"] = lambda i=inst: _unit(ops, i)
        calls[f"probe:{inst.id}"] = lambda i=inst: probe_engine(i.url)
    for p in pairs:
        calls[f"canary:{p.id}"] = lambda p=p: group_canary(p.canary_legs(), canary_count)
        calls[f"pending:{p.id}"] = lambda p=p: pending.safe_read(ops.systemd(p.spec.host), p)
        calls[f"recover:{p.id}"] = lambda p=p: _recovery(ops, p)
    for n, (g, admin) in enumerate(zip(topo.gateways, ops.gateways, strict=True)):
        calls[f"gateway:{n}"] = lambda g=g, a=admin: _gateway(g.url, a, pairs)
    calls["lock"] = partial(_lock, ops)
    got = concurrently(calls, PROBE_WORKERS)
    gateways = [got[f"gateway:{n}"] for n in range(len(topo.gateways))]
    # Each answering gateway's workers by URL: a pair is routed when every one routes it, and
    # a gateway that is down (its host lost) leaves the others' view.
    views = [(g.url, {w.url: w for w in workers}) for g, workers in gateways if workers is not None]
    by_url = views[0][1] if views else {}
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
                _routing(p, [v for _, v in views], got) if views else None,
                pending.describe(*got[f"pending:{p.id}"]),
                got[f"recover:{p.id}"],
                tuple(i.id for i in p.prefills),
                tuple(i.id for i in p.decodes),
            )
            for p in pairs
        ],
        gateways=[g for g, _ in gateways],
        lock=got["lock"][0],
        lock_error=got["lock"][1],
        lock_store=ops.fleet_lock.store.describe() if ops.fleet_lock else None,
        viewed_from=views[0][0] if views else None,
        views=dict(views),
    )


def _recovery(ops: Ops, pair: Pair) -> str | None:
    """What the pair's recovery says while it runs (pdctl recover's sd_notify STATUS=)."""
    try:
        u = ops.systemd(pair.spec.host).show(names.recover_unit(pair.spec.name))
    except PdctlError:
        return None  # the host's units are reported unreachable with its engines
    running = u.active in ("activating", "active")
    return u.status_text if running and u.status_text else None


def _lock(ops: Ops) -> tuple[lock.Holder | None, str | None]:
    """The fleet restart lock's holder when the topology has one, else this host's."""
    try:
        return (ops.fleet_lock.holder() if ops.fleet_lock else lock.holder()), None
    except PdctlError as e:
        return None, str(e)


def _routing(pair: Pair, views: list[dict[str, GatewayWorker]], got: dict[str, Any]) -> str:
    if all(
        (w := by_url.get(i.url)) and w.status == "ready" for by_url in views for i in pair.instances
    ):
        return "routed"
    up = all(got[f"probe:{i.id}"].healthy for i in pair.instances)
    return "drained" if up else "not routed"


def _gateway(
    url: str, admin: GatewayAdmin, pairs: list[Pair]
) -> tuple[GatewayStatus, list[GatewayWorker] | None]:
    """A gateway's status and workers (None: it did not list them)."""
    try:
        ready, detail = admin.readiness()
        canary = gateway_canary(url, admin.headers)
        workers = admin.workers()
    except GatewayError as e:
        return GatewayStatus(url, False, str(e)), None
    pairing = {i.url: p.id for p in pairs for i in p.instances}
    ours = [w for w in workers if w.url in pairing]
    up = sum(w.status == "ready" and w.healthy for w in ours)
    bound = sum(w.pairing == pairing[w.url] for w in ours)
    view = f"{up}/{len(pairing)} ready, {bound} bound"
    return GatewayStatus(url, ready, detail, canary, view), workers


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
                "recovery": p.recovery,
                # Groups only, so a pair's entry stays what scripts read before groups.
                **({"members": {"prefill": p.prefills, "decode": p.decodes}} if p.is_group else {}),
            }
            for p in s.pairs
        ],
        "gateway": asdict(s.gateways[0]),  # the first gateway, as before the list (scripts)
        "gateways": [asdict(g) for g in s.gateways],
        "restart_lock": {
            "held": s.lock is not None,
            "pid": s.lock.pid if s.lock else None,
            "command": s.lock.what if s.lock else None,
            "since": s.lock.since if s.lock else None,
            "held_s": round(now - s.lock.since) if s.lock else None,
            "error": s.lock_error,
            # The fleet restart lock (store: etcd's members; null: only this host's lock).
            "store": s.lock_store,
            "host": s.lock.host if s.lock else None,
            "heartbeat_age_s": s.lock.heartbeat_age_s if s.lock else None,
            "ttl_s": s.lock.ttl_s if s.lock else None,
        },
    }


# ----- the terminal view ------------------------------------------------------------------
# Fields of a line: (minimum width, markup); a line packs its fields into the console's width
# and hangs the rest under the second field, so nothing is cut at any width. One line per
# field below: adding one to a pair, an engine or a gateway is adding a line.


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _uptime(u: UnitStatus | None) -> str:
    if u is None or u.since is None or u.active != "active":
        return "-"
    return _duration(time.time() - u.since)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _metric(fmt: str, v: float | None) -> str:
    return "" if v is None else fmt.format(v)


def _red_unless(ok: bool, text: str | None) -> str:
    """Text from outside (errors, HTTP bodies) as markup: its brackets are not tags."""
    return escape(str(text)) if ok else f"[red]{escape(str(text))}[/]"


def _unit_state(i: InstanceStatus) -> str:
    u = i.unit
    if u is None:  # the error itself: on the engine's line, or once under its host (view)
        return "[red]unit ?[/]"
    return u.sub if u.active == "active" else f"[red]{u.active}/{u.sub}[/]"


def _in_gateway(g: GatewayWorker | None) -> str:
    if g is None:
        return "gateway [yellow]not registered[/]"
    sick = "" if g.healthy else " [red](unhealthy)[/]"
    return f"gateway {escape(g.status)}{sick}, load {g.load}"


def _member(i: InstanceStatus) -> str:
    """A pair's side by its role; a group's member by its role and number (prefill1), padded
    so that a group's prefills and decodes line up."""
    label = i.instance.name.removeprefix(f"{i.instance.pair}-")
    return label if label == i.instance.role.value else label.ljust(len("prefill0"))


ENGINE_FIELDS: list[tuple[int, Callable[[InstanceStatus], str]]] = [
    (7, _member),
    (8, _unit_state),
    (11, lambda i: f"PID {i.unit.main_pid or '-'}" if i.unit else "PID -"),
    (9, lambda i: f"up {_uptime(i.unit)}"),
    (10, lambda i: "/health " + _red_unless(i.probe.healthy, i.probe.health)),
    # metrics, left out when the engine gave none (down, or /metrics unreadable)
    (6, lambda i: _metric("run {:.0f}", i.probe.running)),
    (8, lambda i: _metric("queue {:.0f}", i.probe.queued)),
    (7, lambda i: _metric("KV {:.0%}", i.probe.token_usage)),
    (5, lambda i: {None: "", True: "graph"}.get(i.probe.cuda_graph, "[red]eager[/]")),
    (11, lambda i: _metric("{:.1f} tok/s", i.probe.gen_throughput)),
    (0, lambda i: _red_unless(False, i.probe.metrics_error) if i.probe.metrics_error else ""),
    (0, lambda i: _in_gateway(i.gateway)),
]


def _canary(c: CanaryResult) -> str:
    if c.ok:
        return f"canary ok {c.sent}/{c.sent} {_num(c.latency_s, '{:.3f}s')}"
    return f"canary [red]FAILED {c.failed}/{c.sent}[/]: {escape(str(c.error))}"


PAIR_FIELDS: list[tuple[int, Callable[[PairStatus], str]]] = [
    (0, lambda p: f"[bold]{escape(p.id.partition('/')[2] or p.id)}[/]"),
    (0, lambda p: f"group {p.shape}" if p.is_group else ""),
    (
        6,
        lambda p: {
            None: "-",
            "routed": "routed",
            "drained": f"[yellow]drained[/]: pdctl restart --both --pair {p.id}",
        }.get(p.gateway, _red_unless(False, p.gateway)),
    ),
    (0, lambda p: _canary(p.canary)),
    (0, lambda p: f"[dim]{p.target}[/]"),
    (0, lambda p: f"[yellow]{escape(p.pending)}[/]" if p.pending else ""),
    (0, lambda p: f"[red]{escape(p.recovery)}[/]" if p.recovery else ""),
]

GATEWAY_FIELDS: list[tuple[int, Callable[[GatewayStatus], str]]] = [
    (0, lambda g: g.url),
    (5, lambda g: "ready" if g.ready else f"[red]NOT READY[/]: {escape(g.detail)}"),
    (
        0,
        lambda g: (
            "request -"
            if g.canary is None
            else f"request ok {_num(g.canary.latency_s, '{:.3f}s')}"
            if g.canary.ok
            else "request " + _red_unless(False, g.canary.error)
        ),
    ),
    (0, lambda g: f"workers {escape(g.view)}"),
]


def _lock_fields(s: Status) -> tuple[str, str]:
    if s.lock_error:
        return _red_unless(False, s.lock_error), ""
    if s.lock is None:
        return "free", ""
    who = f"PID {s.lock.pid}" if s.lock.pid else "unknown PID"
    if s.lock.host:
        who = f"{escape(s.lock.host)} {who}"
    held = _duration(time.time() - s.lock.since)
    return f"[yellow]held by {who} for {held}[/]", escape(s.lock.what)


class _Line:
    """Fields packed into the console's width; the overflow hangs under the second field."""

    def __init__(self, indent: int, fields: Iterable[tuple[int, str]]) -> None:
        self.indent = indent
        self.texts = []
        for width, markup in fields:
            if markup:
                t = Text.from_markup(markup)
                t.pad_right(width - t.cell_len)
                self.texts.append(t)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        head, *rest = self.texts
        line = Text(" " * self.indent) + head
        hang = min(line.cell_len + 2, width // 2)
        for t in rest:
            need = len(t.plain.rstrip())  # its padding may run past the edge
            if line.cell_len + 2 + need <= width:
                line += Text("  ") + t
                continue
            if line.plain.strip():
                line.rstrip()
                yield line
            # too long even for a line of its own: wrapped at its spaces, each piece hung
            *full, last = t.wrap(console, width - hang, overflow="fold") or [t]
            for piece in full:
                piece.rstrip()
                yield Text(" " * hang) + piece
            line = Text(" " * hang) + last
        line.rstrip()
        yield line


def _line(indent: int, fields: list[tuple[int, Callable[[Any], str]]], item: Any) -> _Line:
    return _Line(indent, ((w, f(item)) for w, f in fields))


def view(s: Status) -> Group:
    """Hosts with their pairs and groups (one line) and engines (a line each, a group's by
    member), the gateways, the lock."""
    hosts: dict[str, dict[str, list[InstanceStatus]]] = {}
    for i in s.instances:
        hosts.setdefault(i.instance.host, {}).setdefault(i.instance.pair, []).append(i)
    pairs = {p.id: p for p in s.pairs}
    verdict = "[green]healthy[/]" if s.healthy else "[red bold]NOT HEALTHY[/]"
    n_groups = sum(p.is_group for p in s.pairs)
    n_pairs = sum(len(by_pair) for by_pair in hosts.values()) - n_groups
    units = [_n(n_pairs, "pair")] if n_pairs or not n_groups else []
    units += [_n(n_groups, "group")] if n_groups else []
    gateways = s.gateways
    fleet = f"{', '.join(units)} on {_n(len(hosts), 'host')}, {_n(len(gateways), 'gateway')}"
    out: list[Any] = [
        _Line(0, [(0, verdict), (0, fleet)]),
        _Line(0, [(0, "restart lock:"), *((0, f) for f in _lock_fields(s))]),
    ]
    for host, by_pair in hosts.items():
        out.append(Text(host, style="bold underline"))
        # systemd unreadable on the host (ssh down): said once, not per engine
        if errors := [i.unit_error for insts in by_pair.values() for i in insts if i.unit is None]:
            more = f" (and {_n(len(errors) - 1, 'more unit')})" if len(errors) > 1 else ""
            out.append(_Line(2, [(0, "systemd:"), (0, _red_unless(False, errors[0]) + more)]))
        for name, insts in by_pair.items():
            if (p := pairs.get(f"{host}/{name}")) is not None:
                out.append(_line(2, PAIR_FIELDS, p))
            out.extend(_line(4, ENGINE_FIELDS, i) for i in insts)
    out.append(Text("gateways", style="bold underline"))
    out.extend(_line(2, GATEWAY_FIELDS, g) for g in gateways)
    return Group(*out)
