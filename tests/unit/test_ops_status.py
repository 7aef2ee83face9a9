"""pdctl.ops.status: collect() over fake gateways, engines and canaries, and its probes
run at once within a bound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl.cli import status_view
from pdctl.ops import gateway, status
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe
from pdctl.ops.source import Source
from pdctl.pdclient import CanaryResult, gateway_canary
from pdctl.topology import Topology
from tests.unit.ops_fakes import (
    FakeCanaries,
    FakeEngines,
    FakeGateway,
    FakeSystemd,
    Listing,
    fake_ops,
    topo,
)


def test_collect_marks_a_pair_out_of_the_gateway_with_engines_up() -> None:
    t = topo(pairs=("pd0", "pd1", "pd2"))
    down = "http://10.0.0.1:30021"  # pd2's decode
    registered = ["http://10.0.0.1:30000", "http://10.0.0.1:30001"]  # pd0 only
    gw = Listing(held=[GatewayWorker(u, u, "?", "ready", True, 0) for u in registered])
    engines = FakeEngines(lambda url: EngineProbe(url, "HTTP 503" if url == down else "ok"))
    s = status.collect(fake_ops(FakeSystemd(), gw, engines=engines, t=t), 1)
    assert [(p.id, p.gateway, p.drained) for p in s.pairs] == [
        ("node-a/pd0", "routed", False),
        ("node-a/pd1", "drained", True),
        ("node-a/pd2", "not routed", False),
    ]
    assert not s.healthy
    pairs = status_view.to_json(s)["pairs"]
    assert [p["drained"] for p in pairs] == [False, True, False]


def test_collect_reads_routing_from_every_gateway_that_answers() -> None:
    """The first gateway's host lost: routing comes from the others, not None; a pair that
    one answering gateway does not route is drained there, whatever another says."""
    t = topo(hosts=("node-a", "node-b"), pairs=("pd0",))
    everyone = [i.url for i in t.instances]
    routes = {"http://10.0.1.1:8000": everyone, "http://10.0.2.1:8000": everyone[2:]}

    class Down(FakeGateway):
        def readiness(self) -> tuple[bool, str]:
            raise gateway.GatewayError("connection timed out")

    class Routing(Down):
        def readiness(self) -> tuple[bool, str]:
            return True, "ready"

        def workers(self) -> list[GatewayWorker]:
            return [GatewayWorker(u, u, "?", "ready", True, 0) for u in routes[self.url]]

    def collect(*others: str) -> status.Status:
        first = t.gateways[0].model_dump()
        more = [{**first, "host": f"gw{n}", "url": u} for n, u in enumerate(others)]
        fleet = Topology.model_validate({**t.model_dump(), "gateways": [first, *more]})
        admins = [Down(first["url"]), *(Routing(u) for u in others)]
        ops = Ops(
            Source(fleet, None),
            lambda _h: FakeSystemd(),
            admins,
            engines=FakeEngines(),
            canaries=FakeCanaries(),
        )
        return status.collect(ops, 1)

    s = collect("http://10.0.1.1:8000")
    assert list(s.views) == ["http://10.0.1.1:8000"]  # the one that answered
    assert [g.ready for g in s.gateways] == [False, True]
    assert [p.gateway for p in s.pairs] == ["routed", "routed"]
    assert all(None not in i.workers for i in s.instances)
    # A third gateway routes only node-b's pair: node-a's pair is drained.
    s = collect("http://10.0.1.1:8000", "http://10.0.2.1:8000")
    assert [p.gateway for p in s.pairs] == ["drained", "routed"]


def _fleet_topology(urls: list[str], gateway_url: str) -> Topology:
    """topo() on two hosts with two pairs each, its engines at `urls` (8 of them)."""
    d = topo(hosts=("node-a", "node-b"), pairs=("pd0", "pd1")).model_dump(mode="json")
    for inst, url in zip(d["instances"], urls, strict=True):
        inst["url"] = url
    d["gateways"][0]["url"] = gateway_url
    return Topology.model_validate(d)


class _ListingGateway(Listing):
    def canary(self) -> CanaryResult:
        return gateway_canary(self.url, {})  # a real request, among the probes sent at once


def test_status_probes_run_at_once_and_bounded(
    fake_http: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.unit.conftest import InFlight

    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    in_flight = InFlight()
    routes = {"/ready": (200, b""), "/metrics": (200, b""), "/generate": (200, b'{"text":"x"}')}
    engines = [fake_http(routes, delay=0.2, in_flight=in_flight) for _ in range(8)]
    gw = fake_http(routes, delay=0.2, in_flight=in_flight)
    t = _fleet_topology([e.url for e in engines], gw.url)
    ops = Ops(Source(t, None), lambda _h: FakeSystemd(), [_ListingGateway(gw.url)])
    s = status.collect(ops, 1)
    assert s.lock is None and s.lock_error is None
    assert all(i.probe.healthy for i in s.instances) and all(p.canary.ok for p in s.pairs)
    # the 8 health probes (one per engine) were in flight together, not one after another
    assert in_flight.peak > 1
    # and the bound holds: 3 probes at a time, a pair canary being 2 requests (its two legs)
    monkeypatch.setattr(status, "PROBE_WORKERS", 3)
    bounded = InFlight()
    engines = [fake_http(routes, delay=0.2, in_flight=bounded) for _ in range(8)]
    t = _fleet_topology([e.url for e in engines], gw.url)
    ops = Ops(Source(t, None), lambda _h: FakeSystemd(), [_ListingGateway(gw.url)])
    status.collect(ops, 1)
    assert 1 < bounded.peak <= 3 * 2
    assert sum(len(e.seen) for e in engines) == 8 * 2 + 4 * 2  # ready+metrics, canary legs


def test_collect_tells_a_paused_engine_from_one_down() -> None:
    """A paused engine is neither healthy nor a pair drained: status says paused."""
    t = topo(pairs=("pd0",))
    paused = "http://10.0.0.1:30001"
    engines = FakeEngines(lambda url: EngineProbe(url, "paused" if url == paused else "ok"))
    s = status.collect(fake_ops(FakeSystemd(), Listing(), engines=engines, t=t), 1)
    assert [i.state for i in s.instances] == ["ready", "paused"]
    assert not s.healthy and s.pairs[0].gateway == "not routed"
    assert [i["state"] for i in status_view.to_json(s)["instances"]] == ["ready", "paused"]
