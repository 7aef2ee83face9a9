"""pdctl.ops.doctor: each finding from a collected Status."""

from __future__ import annotations

import time
from dataclasses import replace

from pdctl.coord.history import History
from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Store
from pdctl.ops import doctor, gateway
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe
from pdctl.ops.source import Source
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult
from pdctl.topology import TopologyCoord
from tests.unit.ops_fakes import (
    LONG_HOSTS,
    FakeGateway,
    FakeSystemd,
    fake_ops,
    fleet_status,
    topo,
)


def _status(
    canary_ok: bool,
    decode_health: str = "ok",
    usage: float = 0.0,
    active: str = "active",
    pairs: tuple[str, ...] = ("pd0",),
    pairing: dict[str, str | None] | None = None,  # pair -> its workers' pairing protocol
) -> Status:
    t = topo(pairs=pairs)
    insts = []
    for inst in t.instances:
        health = decode_health if inst.role.value == "decode" else "ok"
        unit = UnitStatus(inst.unit, "loaded", active, "running", 9, time.time(), 0, [])
        probe = EngineProbe(inst.url, health, running=0, queued=0, token_usage=usage)
        bound = (pairing or {}).get(inst.pair, f"node-a/{inst.pair}")
        worker = GatewayWorker("id", inst.url, inst.role.value, "ready", True, 0, bound)
        insts.append(InstanceStatus(inst, unit, None, probe, (worker,)))
    canary = CanaryResult(
        canary_ok, 8, 0 if canary_ok else 5, None, None if canary_ok else "decode answered HTTP 500"
    )
    return Status(
        insts,
        [PairStatus(f"node-a/{p}", f"pdstack-{p}.target", canary) for p in pairs],
        [GatewayStatus("http://gw", True, "ready", CanaryResult(True, 1, 0, 0.01))],
        views={"http://gw": {w.url: w for i in insts for w in i.workers if w}},
    )


def test_workers_not_bound_to_their_pair_are_found_when_pairs_can_mix() -> None:
    two = ("pd0", "pd1")
    assert doctor.pair_findings(_status(True, pairs=two)) == []
    found = doctor.pair_findings(_status(True, pairs=two, pairing={"pd1": None}))
    assert [(f.id, f.where) for f in found] == [
        ("live-unbound", "node-a/pd1-prefill"),
        ("live-unbound", "node-a/pd1-decode"),
    ]
    assert "pairing protocol (none), not node-a/pd1" in found[0].message
    assert found[0].fix == "pdctl restart --both --pair node-a/pd1"
    # One pair has nothing to mix with.
    assert doctor.pair_findings(_status(True, pairing={"pd0": None})) == []


def test_degraded_pair_versus_pair_down() -> None:
    (f,) = doctor.pair_findings(_status(False))
    assert f.id == "live-degraded-pair" and f.where == "node-a/pd0"
    assert "5/8 canary requests failed while both sides answer /ready" in f.message
    assert f.fix == "run pdctl restart --both --pair node-a/pd0"
    (f,) = doctor.pair_findings(_status(False, decode_health="HTTP 503"))
    assert f.id == "live-pair-down" and "pd0-decode does not answer /ready" in f.message
    assert doctor.pair_findings(_status(True)) == []


def test_kv_held_while_idle_and_failed_units() -> None:
    held = doctor.kv_findings(_status(True, usage=0.4))
    assert [f.where for f in held] == ["node-a/pd0-prefill", "node-a/pd0-decode"]
    assert "KV usage 40% with no running or queued request" in held[0].message
    assert doctor.kv_findings(_status(True, usage=0.01)) == []
    failed = doctor.unit_findings(_status(True, active="failed"))
    assert {x.id for x in failed} == {"live-unit"}


def test_flag_drift_against_the_units_execstart() -> None:
    assert doctor._flags(
        [
            "/usr/bin/numactl",
            "--cpunodebind=0",
            "python",
            "-m",
            "pdctl.sim",
            "--port",
            "1",
            "--cuda-graph-bs-decode",
            "8",
            "16",
            "--enable-metrics",
        ]
    ) == {"--port": ("1",), "--cuda-graph-bs-decode": ("8", "16"), "--enable-metrics": ()}


def test_drift_between_the_running_process_and_its_units_execstart() -> None:
    argv = ["/opt/pdstack/venv/bin/python", "-m", "pdctl.sim", "--port", "30001"]

    class Drifted(FakeSystemd):
        def cmdline(self, pid: int) -> list[str]:
            return [*argv, "--cuda-graph-max-bs-decode", "32"]

    s = _status(True)
    unit = s.instances[1].unit
    assert unit is not None
    execstart = ["/usr/bin/numactl", "--cpunodebind=0", *argv, "--cuda-graph-max-bs-decode", "64"]
    s.instances[1] = InstanceStatus(
        s.instances[1].instance,
        UnitStatus(**{**unit.__dict__, "exec_start": execstart}),
        None,
        s.instances[1].probe,
        s.instances[1].workers,
    )
    (f,) = doctor.drift_findings(fake_ops(Drifted(), FakeGateway()), s)
    assert f.id == "live-drift" and f.where == "node-a/pd0-decode"
    assert (
        "--cuda-graph-max-bs-decode: running 32, expected 64" in f.message
        and "its unit's ExecStart" in f.message
    )


def test_doctor_says_etcd_cannot_serve_the_lock_or_its_last_holder_lost_it(
    etcd_coord: TopologyCoord,
) -> None:
    t = topo(hosts=LONG_HOSTS, pairs=("pd0",)).model_copy(update={"coord": etcd_coord})
    store = Store(etcd_coord)
    ops = Ops(
        Source(t, None),
        lambda _host: FakeSystemd(),
        [gateway.GatewayAdmin("http://gw")],
        store=store,
        fleet_lock=RestartLock(store, 30),
    )
    s = replace(fleet_status(), lock_store=store.describe())
    assert doctor.lock_findings(ops, s) == []
    error = "cannot read: etcd has no quorum: 1 of 3 members answer"
    (down,) = doctor.lock_findings(ops, replace(s, lock_error=error))
    assert (down.id, down.severity, down.where) == ("live-fleet-lock", "error", store.describe())
    assert down.message.startswith(error) and "recoveries wait" in down.message
    History(store).start("pdctl restart --all")  # and then its holder was killed
    (lost,) = doctor.lock_findings(ops, s)
    assert (lost.id, lost.severity) == ("live-fleet-lock-lost", "warning")
    assert "pdctl restart --all lost the fleet restart lock before it finished" in lost.message
    # ... and it left a pair half-restarted: that, and the command that finishes it
    why = "abandoned restart of node-a/pd0 at phase stop by ctl PID 7 (since 12:00:00)"
    left = replace(s, pairs=[replace(s.pairs[0], abandoned=why)])
    (abandoned,) = doctor.lock_findings(ops, left)
    assert (abandoned.id, abandoned.severity, abandoned.where) == (
        "live-abandoned-restart",
        "error",
        s.pairs[0].id,
    )
    assert (abandoned.message, abandoned.fix) == (why, "pdctl finish")


def test_a_paused_engine_is_found_with_the_call_that_resumes_it() -> None:
    s = _status(False, decode_health="paused")
    (f,) = doctor.paused_findings(s)
    assert (f.id, f.where) == ("live-paused", "node-a/pd0-decode")
    assert "generation is paused" in f.message
    url = s.instances[1].instance.url
    assert f.fix == (
        f"curl -X POST {url}/continue_generation -H 'Content-Type: application/json' -d '{{}}'"
    )
    # the canary it holds is not reported again as a pair down or degraded
    assert doctor.pair_findings(s) == []
    assert doctor.paused_findings(_status(True)) == []
