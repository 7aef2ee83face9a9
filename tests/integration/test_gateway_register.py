"""The gateway started as its unit starts it: smg with no workers, then `pdctl gateway
register` (the unit's ExecStartPost=) binding every pair. Real smg, sim engines.

Without the binding, smg's round robin drifts across pairs whenever one side of a pair
becomes routable before the other (docs/gateway.md, "Groups stay groups"); these tests
count KV transfers across pairs from the first request after each gateway start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from pdctl import render, topology
from pdctl.ops.context import Ops
from pdctl.ops.doctor import doctor
from pdctl.ops.restart import restart_pairs
from pdctl.ops.status import collect
from pdctl.testing.localproc import HOST, LocalPair, local_ops
from pdctl.testing.stack import (
    Gateway,
    SimProc,
    constant_load,
    cross_group_transfers,
    partner_env,
    wait_until,
)

pytestmark = pytest.mark.gateway

STARTS = 3  # unbound, one fresh start in three crossed pairs for good (docs/gateway.md)


def _pairs(sim_factory: Callable[..., SimProc]) -> list[LocalPair]:
    pairs = []
    for n in range(2):
        prefill = sim_factory("prefill")
        decode = sim_factory("decode", env=partner_env(prefill))
        pairs.append(LocalPair(f"pd{n}", prefill, decode))
    for p in pairs:
        p.prefill.wait_healthy()
        p.decode.wait_healthy()
    return pairs


def _pdctl(topo_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pdctl ARGS` in its own process, as the gateway unit runs it."""
    return subprocess.run(
        [sys.executable, "-c", "from pdctl.cli import main; main()", *args,
         "--topology", str(topo_file), "--format", "json"],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def _register_cli(topo_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _pdctl(topo_file, "gateway", "register", *args)


def _pairings(gw: Gateway) -> dict[str, str | None]:
    workers = requests.get(f"{gw.url}/workers", timeout=5).json()["workers"]
    return {w["url"]: w.get("pairing_protocol") for w in workers}


def _expected(ops: Ops) -> dict[str, str]:
    return {i.url: p.id for p in ops.source.pairs() for i in p.instances}


def test_smg_takes_pd_mode_with_no_worker_on_its_command_line(
    gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    """What the gateway unit relies on: no --prefill/--decode is accepted, and smg says it
    is not ready until workers are registered."""
    gw = gateway_factory([], [])
    assert gw.wait_listening() and gw.proc.poll() is None
    assert requests.get(f"{gw.url}/workers", timeout=5).json()["workers"] == []
    assert requests.get(f"{gw.url}/readiness", timeout=5).status_code == 503


def test_register_binds_every_pair_from_the_first_request_after_each_start(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    pairs = _pairs(sim_factory)
    decodes = [p.decode for p in pairs]
    served = 0
    for start in range(STARTS):
        gw = gateway_factory([], [], "--policy", "round_robin")
        ops, _ = local_ops(pairs, gw)
        topo_file = tmp_path / f"topology-{start}.yaml"
        topo_file.write_text(topology.dump(ops.source.topology))
        # The unit's ExecStartPost= argv, right after the spawn: it waits for smg to answer.
        reg = _pdctl(topo_file, *render.register_command(HOST)[1:])
        assert reg.returncode == 0, reg.stderr
        (done,) = json.loads(reg.stdout)
        assert done["error"] is None and set(done["workers"].values()) == {"added"}
        gw.wait_ready()
        with constant_load(gw.url, timeout=30) as outcomes:
            wait_until(lambda: len(outcomes) >= 150, 60, "150 requests")
        failed = [o.failure for o in outcomes if not o.ok]
        assert not failed, f"start {start}: {len(failed)} of {len(outcomes)} failed: {failed[:5]}"
        served += len(outcomes)
        wait_until(lambda g=gw: len(_pairings(g)) == 4, 30, "all four workers listed")
        assert _pairings(gw) == _expected(ops)
        crossed = cross_group_transfers(decodes)
        assert set(crossed.values()) == {0.0}, f"start {start}: KV across pairs: {crossed}"
        # Idempotent: a second run changes nothing and says the workers are bound.
        again = _register_cli(topo_file, "--gateway", HOST)
        assert again.returncode == 0, again.stderr
        assert set(json.loads(again.stdout)[0]["workers"].values()) == {"bound"}
        findings, _ = doctor(ops, canary_count=2)
        assert [f for f in findings if f.id == "live-unbound"] == []
        gw.stop()
    # Every decode served, so its counter of zero means something.
    for d in decodes:
        text = requests.get(f"{d.url}/metrics", timeout=5).text
        assert "pdsim_cross_group_transfers_total" in text
    assert served >= STARTS * 150


def test_register_removes_the_workers_of_a_pair_that_left_the_profile(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """A gateway keeps its workers across site.yml runs; the register after a profile lost a
    pair (the role's, or the unit's next start) takes that pair out, and only that pair."""
    pairs = _pairs(sim_factory)
    gw = gateway_factory([], [], "--policy", "round_robin")
    both, _ = local_ops(pairs, gw)
    both_file = tmp_path / "both.yaml"
    both_file.write_text(topology.dump(both.source.topology))
    assert _register_cli(both_file, "--gateway", HOST).returncode == 0
    wait_until(lambda: _pairings(gw) == _expected(both), 30, "both pairs listed")

    kept, _ = local_ops(pairs[:1], gw)
    kept_file = tmp_path / "kept.yaml"
    kept_file.write_text(topology.dump(kept.source.topology))
    reg = _register_cli(kept_file, "--gateway", HOST)
    assert reg.returncode == 0, reg.stderr
    (done,) = json.loads(reg.stdout)
    gone = [pairs[1].prefill.url, pairs[1].decode.url]
    assert done["workers"] == {
        **dict.fromkeys(gone, "removed"),
        **dict.fromkeys(_expected(kept), "bound"),
    }
    wait_until(lambda: _pairings(gw) == _expected(kept), 30, "pd1's workers gone")
    with constant_load(gw.url, timeout=30) as outcomes:
        wait_until(lambda: len(outcomes) >= 50, 60, "50 requests")
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed: {failed[:5]}"
    again = _register_cli(kept_file, "--gateway", HOST)
    assert set(json.loads(again.stdout)[0]["workers"].values()) == {"bound"}


def test_register_reports_a_gateway_that_does_not_answer(
    sim_factory: Callable[..., SimProc], tmp_path: Path, gateway_factory: Callable[..., Gateway]
) -> None:
    pairs = _pairs(sim_factory)
    gw = gateway_factory([], [])
    ops, _ = local_ops(pairs, gw)
    gw.stop()
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(topology.dump(ops.source.topology))
    reg = _register_cli(topo_file, "--timeout", "1")
    assert reg.returncode == 1
    (done,) = json.loads(reg.stdout)
    assert done["url"] == gw.url and "(still, after 1s)" in done["error"]
    bad = _register_cli(topo_file, "--gateway", "nowhere")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "Error: no gateway on 'nowhere'; gateways run on: local"


def test_two_gateways_roll_under_load_with_both_bound(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The HA layout: two gateways over both pairs. A roll drains and registers each pair at
    both; streaming load through both sees no failure and no transfer across pairs."""
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    pairs = _pairs(sim_factory)
    gws = [gateway_factory([], [], "--policy", "round_robin") for _ in range(2)]
    ops, units = local_ops(pairs, gws[0], others=gws[1:])
    ops.say = lambda line: print(line, file=sys.stderr)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(topology.dump(ops.source.topology))
    reg = _register_cli(topo_file, "--timeout", "30")  # every gateway of the topology
    assert reg.returncode == 0, reg.stderr
    assert [d["host"] for d in json.loads(reg.stdout)] == ["local", "local-2"]
    for gw in gws:
        gw.wait_ready()
    snapshots: list[dict[str, float]] = []
    stop = units.stop

    def stop_after_reading(*names: str) -> None:  # a decode's counter dies with it
        snapshots.append(cross_group_transfers([p.decode for p in pairs]))
        stop(*names)

    monkeypatch.setattr(units, "stop", stop_after_reading)
    with (
        constant_load(gws[0].url, clients=2, timeout=30) as first,
        constant_load(gws[1].url, clients=2, timeout=30) as second,
    ):
        wait_until(lambda: len(first) >= 20 and len(second) >= 20, 30, "load through both")
        reports = restart_pairs(ops, ops.source.pairs())
        n1, n2 = len(first), len(second)
        wait_until(lambda: len(first) >= n1 + 30 and len(second) >= n2 + 30, 30, "load after")
    snapshots.append(cross_group_transfers([p.decode for p in pairs]))
    assert [r.ok for r in reports] == [True, True], [r.error for r in reports]
    for gw in gws:
        assert _pairings(gw) == _expected(ops)
    status = collect(ops, canary_count=2)  # pdctl status: each gateway's view
    assert [(g.url, g.view) for g in status.gateways] == [
        (gw.url, "4/4 ready, 4 bound") for gw in gws
    ]
    assert status.healthy
    assert [s for s in snapshots if any(s.values())] == []
    failed = [o.failure for o in [*first, *second] if not o.ok]
    assert not failed, f"{len(failed)} of {len(first) + len(second)} failed: {failed[:5]}"
