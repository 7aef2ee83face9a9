"""Groups in `pdctl status` (members per role, 80 columns, JSON) and in `pdctl doctor` (members
the gateway holds under another group's pairing protocol or none), from a fake gateway's
worker list through the real collect()."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from pdctl.cli import status_view
from pdctl.ops import doctor, status
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe
from pdctl.ops.source import Source
from pdctl.pdclient import CanaryResult
from pdctl.topology import Topology
from tests.unit.ops_fakes import FakeCanaries, FakeEngines, FakeSystemd, Listing

HOST = "gpu-node-017.dc1.example.com"
# name -> (prefills, decodes): a pair beside a 2P1D group
UNITS = {"pd0": (1, 1), "g0": (2, 1)}


def _topology(gateways: int = 1) -> Topology:
    instances: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    port = 30000
    for name, counts in UNITS.items():
        ids: dict[str, list[str]] = {}
        for role, count in zip(("prefill", "decode"), counts, strict=True):
            for n in range(count):
                member = f"{name}-{role}" if counts == (1, 1) else f"{name}-{role}{n}"
                ids.setdefault(role, []).append(f"{HOST}/{member}")
                instances.append(
                    {
                        "id": f"{HOST}/{member}",
                        "host": HOST,
                        "name": member,
                        "pair": name,
                        "role": role,
                        "unit": f"pdstack-{member}.service",
                        "url": f"http://10.0.0.1:{port}",
                        "numa_node": 0,
                        "gpus": [port - 30000],
                        "bootstrap_port": port + 1000 if role == "prefill" else None,
                    }
                )
                port += 1
        unit = {"host": HOST, "name": name, "target": f"pdstack-{name}.target"}
        if counts == (1, 1):
            pairs.append({**unit, "prefill": ids["prefill"][0], "decode": ids["decode"][0]})
        else:
            groups.append({**unit, **ids})
    routers = [
        {
            "host": f"router-{n}",
            "url": f"http://10.0.9.{n}:8000",
            "metrics_url": f"http://10.0.9.{n}:29000/metrics",
            "unit": "pdstack-gateway.service",
        }
        for n in range(1, gateways + 1)
    ]
    return Topology.model_validate(
        {
            "model": "sim",
            "engine": "sim",
            "instances": instances,
            "pairs": pairs,
            "groups": groups,
            "gateways": routers,
        }
    )


def _collect(*pairings: dict[str, str | None]) -> status.Status:
    """Status with every engine up and a gateway per `pairings` (member name -> protocol),
    which holds every other worker under its group's id."""
    topo = _topology(len(pairings))

    def held(pairing: dict[str, str | None]) -> list[GatewayWorker]:
        return [
            GatewayWorker(
                i.url,
                i.url,
                i.role.value,
                "ready",
                True,
                0,
                pairing.get(i.name, f"{i.host}/{i.pair}"),
            )
            for i in topo.instances
        ]

    ok = CanaryResult(True, 3, 0, 0.05)
    admins = [Listing(g.url, held(p)) for g, p in zip(topo.gateways, pairings, strict=True)]
    ops = Ops(
        Source(topo, None),
        lambda _h: FakeSystemd(),
        [*admins],
        engines=FakeEngines(lambda url: EngineProbe(url, "ok", 1, 0, 0.1)),
        canaries=FakeCanaries(lambda _n: ok),
    )
    return status.collect(ops, 1)


def _render(s: status.Status, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(status_view.view(s))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 200])
def test_status_shows_a_group_with_its_members_per_role(width: int) -> None:
    s = _collect({})
    assert s.healthy
    lines = _render(s, width)
    assert all(len(line) <= width for line in lines)
    text = "\n".join(lines)
    assert "healthy  1 pair, 1 group on 1 host, 1 gateway" in text
    engines = lines[: lines.index("gateways")]
    heads = [line.split()[:3] for line in engines if line.startswith("  ") and line[2] != " "]
    assert heads == [["pd0", "routed", "canary"], ["g0", "group", "2P1D"]]
    g0 = lines.index(next(line for line in lines if line.startswith("  g0 ")))
    member_lines = [line for line in engines[g0:] if line.startswith("    ") and line[4] != " "]
    assert [line.split()[0] for line in member_lines] == ["prefill0", "prefill1", "decode0"]
    # A group's members line up their fields; the pair's sides keep their role as name.
    assert len({line.index("PID") for line in member_lines}) == 1
    pd0 = [line for line in engines[:g0] if line.startswith("    ") and line[4] != " "]
    assert [line.split()[0] for line in pd0] == ["prefill", "decode"]
    data = status_view.to_json(s)
    pair, group = data["pairs"]
    assert "members" not in pair  # a pair's entry is what it was before groups
    assert group["members"] == {
        "prefill": (f"{HOST}/g0-prefill0", f"{HOST}/g0-prefill1"),
        "decode": (f"{HOST}/g0-decode0",),
    }


def test_doctor_finds_members_bound_to_another_group_or_none() -> None:
    assert doctor.binding_findings(_collect({})) == []
    s = _collect({"g0-prefill1": f"{HOST}/pd0", "g0-decode0": None})
    found = doctor.pair_findings(s)
    assert [(f.id, f.where) for f in found] == [
        ("live-misbound", f"{HOST}/g0-prefill1"),
        ("live-unbound", f"{HOST}/g0-decode0"),
    ]
    crossed, unbound = found
    assert (
        f"prefill of {HOST}/g0 is registered at http://10.0.9.1:8000 under {HOST}/pd0's "
        "pairing protocol" in crossed.message
    )
    assert f"pairs it with {HOST}/pd0's workers" in crossed.message
    assert f"pairing protocol (none), not {HOST}/g0" in unbound.message
    assert {f.fix for f in found} == {f"pdctl restart --both --pair {HOST}/g0"}


def test_a_lone_group_bound_alike_has_nothing_to_mix_with_but_mixed_cannot_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(UNITS, "pd0")  # g0 alone
    unbound = {"g0-prefill0": None, "g0-prefill1": None, "g0-decode0": None}
    assert doctor.binding_findings(_collect(unbound)) == []
    # One prefill unbound beside bound members: it pairs with no decode of its group.
    (f,) = doctor.binding_findings(_collect({"g0-prefill1": None}))
    assert (f.id, f.where) == ("live-unbound", f"{HOST}/g0-prefill1")


def test_doctor_reads_every_gateways_bindings() -> None:
    """Bound at the first gateway, held under the pair's id at the second: the finding names
    the second."""
    s = _collect({}, {"g0-decode0": f"{HOST}/pd0"})
    assert list(s.views) == ["http://10.0.9.1:8000", "http://10.0.9.2:8000"]
    (f,) = doctor.binding_findings(s)
    assert (f.id, f.where) == ("live-misbound", f"{HOST}/g0-decode0")
    assert "registered at http://10.0.9.2:8000 under" in f.message
