"""`pdctl status` as a terminal shows it (per host and pair, fitting 80 columns) and as JSON
for scripts: views of what pdctl.ops.status collects."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.text import Text

from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult


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
                "state": i.state,  # ready, paused, draining, not ready
                "url": i.instance.url,
                # Per gateway that listed its workers; null: not registered there.
                "gateways": {
                    url: {"status": w.status, "healthy": w.healthy, "load": w.load} if w else None
                    for url, w in zip(s.views, i.workers, strict=True)
                },
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
                "abandoned": p.abandoned,
                # Groups only, so a pair's entry stays what scripts read before groups.
                **({"members": {"prefill": p.prefills, "decode": p.decodes}} if p.is_group else {}),
            }
            for p in s.pairs
        ],
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


def _readiness(i: InstanceStatus) -> str:
    """Its /ready (or /health) answer; paused and draining in yellow: states an operator put
    it in, not failures."""
    if i.state in ("paused", "draining"):
        return f"[yellow]{i.state}[/]"
    return _red_unless(i.probe.healthy, i.probe.health)


def _in_gateways(workers: tuple[GatewayWorker | None, ...]) -> str:
    """How the gateways that listed their workers hold this one: its status (each distinct
    one), unhealthy at any, its load at all of them, and where it is missing."""
    held = [w for w in workers if w is not None]
    noun = "gateway" if len(workers) <= 1 else "gateways"
    if not held:
        return f"{noun} [yellow]not registered[/]"
    states = "/".join(escape(s) for s in dict.fromkeys(w.status for w in held))
    sick = "" if all(w.healthy for w in held) else " [red](unhealthy)[/]"
    missing = len(workers) - len(held)
    absent = f", [yellow]not registered at {missing} of {len(workers)}[/]" if missing else ""
    return f"{noun} {states}{sick}, load {sum(w.load for w in held)}{absent}"


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
    (10, lambda i: f"{i.probe.ready_path} {_readiness(i)}"),
    # metrics, left out when the engine gave none (down, or /metrics unreadable)
    (6, lambda i: _metric("run {:.0f}", i.probe.running)),
    (8, lambda i: _metric("queue {:.0f}", i.probe.queued)),
    (7, lambda i: _metric("KV {:.0%}", i.probe.token_usage)),
    (5, lambda i: {None: "", True: "graph"}.get(i.probe.cuda_graph, "[red]eager[/]")),
    (11, lambda i: _metric("{:.1f} tok/s", i.probe.gen_throughput)),
    (0, lambda i: _red_unless(False, i.probe.metrics_error) if i.probe.metrics_error else ""),
    (0, lambda i: _in_gateways(i.workers)),
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
    (0, lambda p: f"[red]{escape(p.abandoned)}[/]: pdctl finish" if p.abandoned else ""),
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
    # Groups across hosts: after the hosts, each with its members under their hosts.
    across: dict[str, dict[str, list[InstanceStatus]]] = {}
    for i in s.instances:
        hosts.setdefault(i.instance.host, {})
        held = across.setdefault(i.pair_id, {}) if i.fleet_id else hosts[i.instance.host]
        held.setdefault(i.instance.host if i.fleet_id else i.pair_id, []).append(i)
    pairs = {p.id: p for p in s.pairs}
    verdict = "[green]healthy[/]" if s.healthy else "[red bold]NOT HEALTHY[/]"
    n_groups = sum(p.is_group for p in s.pairs)
    n_pairs = len(s.pairs) - n_groups
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
        for pid, insts in by_pair.items():
            if (p := pairs.get(pid)) is not None:
                out.append(_line(2, PAIR_FIELDS, p))
            out.extend(_line(4, ENGINE_FIELDS, i) for i in insts)
    if across:
        out.append(Text("across hosts", style="bold underline"))
    for pid, by_host in across.items():
        if (p := pairs.get(pid)) is not None:
            out.append(_line(2, PAIR_FIELDS, p))
        for host, insts in by_host.items():
            out.append(Text(f"    {host}"))
            out.extend(_line(6, ENGINE_FIELDS, i) for i in insts)
    out.append(Text("gateways", style="bold underline"))
    out.extend(_line(2, GATEWAY_FIELDS, g) for g in gateways)
    return Group(*out)
