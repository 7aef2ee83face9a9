"""pdctl.ops modules with fakes: lock, systemctl parsing and ssh, rate limiter, pair
selection, plan lines, restart failure handling, doctor findings."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pdctl import names, render
from pdctl.cli import status_view
from pdctl.coord.history import History
from pdctl.coord.lock import Holder, RestartLock
from pdctl.coord.store import Store
from pdctl.errors import PdctlError
from pdctl.ops import doctor, gateway, lock, restart, systemd
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe, probe_engine
from pdctl.ops.recover import RateLimit, RateLimited, RecoveryLog
from pdctl.ops.source import Source
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult, pair_canary
from pdctl.spec import Deployment
from pdctl.topology import Topology, TopologyCoord

ROOT = Path(__file__).resolve().parents[2]


def topo(hosts: tuple[str, ...] = ("node-a",), pairs: tuple[str, ...] = ("pd0", "pd1")) -> Topology:
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
            "router": {
                "host": hosts[0],
                "url": "http://10.0.0.1:8000",
                "metrics_url": "http://10.0.0.1:29000/metrics",
                "unit": "pdstack-gateway.service",
            },
        }
    )


# ----- lock ---------------------------------------------------------------------------
def test_lock_refusal_names_the_holder_and_is_released(tmp_path: Path) -> None:
    path = tmp_path / "run" / "restart.lock"
    with lock.held("pdctl restart --both --pair pd0", path):
        with pytest.raises(lock.LockHeld) as e, lock.held("second", path):
            pass
        assert "pdctl restart --both --pair pd0" in str(e.value)
        assert f"PID {__import__('os').getpid()}" in str(e.value)
        assert e.value.exit_code == 3
    with pytest.raises(RuntimeError), lock.held("third", path):
        raise RuntimeError("boom")
    with lock.held("fourth", path):  # released after the exception
        pass


def test_lock_conflicts_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "restart.lock"
    code = (
        "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR); "
        "fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)"
    )
    with lock.held("holder", path):
        held = subprocess.run(["python3", "-c", code, str(path)], capture_output=True)
    free = subprocess.run(["python3", "-c", code, str(path)], capture_output=True)
    assert held.returncode != 0 and free.returncode == 0


# ----- systemd ------------------------------------------------------------------------
SHOW = """LoadState=loaded
ActiveState=active
SubState=running
MainPID=4242
ActiveEnterTimestamp=@1764400000
NRestarts=2
ExecStart={ path=/usr/bin/numactl ; argv[]=/usr/bin/numactl --cpunodebind=0 \
/opt/pdstack/venv/bin/python -m pdctl.sim --port 30001 ; ignore_errors=no ; pid=0 }
"""  # the backslash joins the ExecStart line


def test_parse_show() -> None:
    st = systemd.parse_show("u.service", SHOW)
    assert (st.active, st.sub, st.main_pid, st.since, st.restarts) == (
        "active",
        "running",
        4242,
        1764400000.0,
        2,
    )
    assert st.exec_start[-4:] == ["-m", "pdctl.sim", "--port", "30001"]
    stopped = systemd.parse_show(
        "u.service", "ActiveState=inactive\nMainPID=0\nActiveEnterTimestamp=\n"
    )
    assert (stopped.active, stopped.main_pid, stopped.since) == ("inactive", 0, None)


@dataclass
class FakeRun:
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    argv: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, self.returncode, self.stdout, self.stderr)


def test_remote_systemctl_goes_through_ssh_and_names_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(stdout=SHOW)
    monkeypatch.setattr(subprocess, "run", fake)
    sd = systemd.Systemctl("node-b", "root@10.0.1.1")
    assert sd.show("pdstack-pd0-decode.service").main_pid == 4242
    sd.stop("pdstack-pd0.target")
    assert fake.argv[0][:-1] == [*systemd.SSH, "root@10.0.1.1"]
    assert fake.argv[1][-1] == "systemctl stop pdstack-pd0.target"
    fake.returncode, fake.stderr = 255, "ssh: connect to host 10.0.1.1 port 22: No route to host"
    with pytest.raises(systemd.HostError, match=r"node-b: unreachable: .*No route to host"):
        sd.show("x.service")


def test_remote_host_ssh_user_and_config_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(stdout=SHOW)
    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setenv("PDCTL_SSH_USER", "ops")
    monkeypatch.setenv("PDCTL_SSH_CONFIG", "/srv/fleet/ssh_config")
    systemd.for_host("node-b", "192.0.2.7").show("pdstack-pd0-decode.service")
    assert fake.argv[0][:-1] == [*systemd.SSH, "-F", "/srv/fleet/ssh_config", "ops@192.0.2.7"]


def test_local_systemctl_runs_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun(stdout="line 1\nline 2\n")
    monkeypatch.setattr(subprocess, "run", fake)
    sd = systemd.Systemctl("here")
    assert sd.journal("u.service", 2) == ["line 1", "line 2"]
    assert fake.argv == [["journalctl", "-u", "u.service", "-n", "2", "-o", "cat", "--no-pager"]]


def test_loopback_is_local() -> None:
    assert systemd.is_local("not-this-host", "127.0.0.1")
    assert not systemd.is_local("not-this-host", "192.0.2.1")  # TEST-NET-1, never ours


# ----- recovery rate limit --------------------------------------------------------------
def test_rate_limit_window(tmp_path: Path) -> None:
    now = [1000.0]
    log = RecoveryLog(tmp_path / "state.json", clock=lambda: now[0])
    limit = RateLimit(max_count=2, window_s=100)
    log.admit("node-a/pd0", limit)
    now[0] += 10
    log.admit("node-a/pd0", limit)
    log.admit("node-a/pd1", limit)  # other pairs count separately
    with pytest.raises(RateLimited, match="2 recoveries in the last 100s"):
        log.admit("node-a/pd0", limit)
    now[0] += 95  # the first one left the window
    log.admit("node-a/pd0", limit)
    assert len(log.recent("node-a/pd0", 100)) == 2


def test_rate_limit_survives_a_corrupt_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    RecoveryLog(path).admit("p", RateLimit(1, 60))
    assert len(RecoveryLog(path).recent("p", 60)) == 1


# ----- selection ------------------------------------------------------------------------
def test_pair_names_across_hosts() -> None:
    src = Source(topo(("node-a", "node-b")), None)
    assert [p.id for p in src.select(("node-b/pd1",), False)] == ["node-b/pd1"]
    assert len(src.select((), True)) == 4
    with pytest.raises(PdctlError, match="on several hosts; use one of: node-a/pd0, node-b/pd0"):
        src.select(("pd0",), False)
    with pytest.raises(PdctlError, match="unknown instance 'pd7-decode'; valid instances:"):
        src.instance("pd7-decode")


# ----- restart --------------------------------------------------------------------------
class FakeSystemd:
    host = "node-a"

    def __init__(self, fail_start: set[str] = frozenset()) -> None:  # type: ignore[assignment]
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


class FakeGateway:
    # The real registration and wait, over the fake listing and add below.
    register = gateway.GatewayAdmin.register
    wait_answering = gateway.GatewayAdmin.wait_answering

    def __init__(self, url: str = "http://gw:8000") -> None:
        self.url = url
        self.calls: list[str] = []

    def remove(self, urls: list[str]) -> None:
        self.calls += [f"remove {u}" for u in urls]

    def add(self, url: str, kind: str, port: int | None = None, pairing: str | None = None) -> None:
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


def fake_ops(sd: FakeSystemd, gw: FakeGateway, *others: FakeGateway) -> Ops:
    t = topo()
    if others:  # a gateway per fake, the first on the topology's router host
        extra = [
            t.router.model_copy(update={"host": f"router-{n}", "url": o.url})
            for n, o in enumerate(others, 2)
        ]
        t = t.model_copy(update={"gateways": [t.router, *extra]})
    return Ops(
        Source(t, None),
        lambda _h: sd,
        [gw, *others],  # type: ignore[list-item]
        Timeouts(health=0.3, canary=0.3, poll=0.01),
        say=lambda _l: None,
        in_flight=lambda _u: 0,
    )


class Unreachable(FakeGateway):
    def workers(self) -> list[GatewayWorker]:
        raise gateway.GatewayError(f"gateway {self.url}: ConnectionError: refused")


def test_plan_lines_name_every_step() -> None:
    ops = fake_ops(FakeSystemd(), FakeGateway())
    text = "\n".join(restart.plan_lines(ops, ops.source.pairs()))
    assert "1. pair node-a/pd0 (pdstack-pd0.target): http://10.0.0.1:30000 + " in text
    assert (
        "systemctl stop pdstack-pd1.target pdstack-pd1-prefill.service "
        "pdstack-pd1-decode.service on node-a (returns once both engines are down)"
    ) in text
    assert "verify    5 more; every one must pass" in text
    assert "Pairs restart one at a time" in text


def test_a_unit_failing_to_start_stops_the_roll(monkeypatch: pytest.MonkeyPatch) -> None:
    sd, gw = FakeSystemd(fail_start={"pdstack-pd0-decode.service"}), FakeGateway()
    monkeypatch.setattr(
        restart, "probe_engine", lambda url: EngineProbe(url, "unreachable (ConnectionError)")
    )
    ops = fake_ops(sd, gw)
    reports = restart.restart_pairs(ops, ops.source.pairs())
    assert len(reports) == 1 and not reports[0].ok
    assert "pdstack-pd0-decode.service is failed" in (reports[0].error or "")
    assert "stays out of the gateway" in (reports[0].error or "")
    assert reports[0].journal["pdstack-pd0-decode.service"] == [
        "pdstack-pd0-decode.service: RuntimeError: CUDA out of memory"
    ]
    assert [line.split(":")[0] for line in reports[0].lines] == ["FAILED", "FAILED"]
    assert ("stop", PD0_STOP) in sd.jobs
    assert not any("pd1" in " ".join(u) for _, u in sd.jobs)  # pd1 untouched
    assert not any(c.startswith("add") for c in gw.calls)  # never re-registered


# systemctl waits only for the jobs of the units it names, and a target's own stop job ends
# before the stops PartOf= queued for its engines: the stop names them, so it returns once
# both are down, and the start never brings a new engine up beside an old one still stopping.
PD0_STOP = ("pdstack-pd0.target", "pdstack-pd0-prefill.service", "pdstack-pd0-decode.service")


def test_the_stop_waits_for_both_engines_not_only_the_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _steps_pass(monkeypatch)
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert rep.ok, rep.error
    assert [j for j in sd.jobs if j[0] in ("stop", "start")] == [
        ("stop", PD0_STOP),
        ("start", ("pdstack-pd0.target",)),
    ]


LOST = "its lease expired and pdf2 PID 7 pdctl restart --all, since 12:00:00 holds the lock now"


def _steps_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(restart, "_first_canary", lambda *_: None)
    monkeypatch.setattr(restart, "_verify", lambda *_: None)
    monkeypatch.setattr(restart, "register_pair", lambda *_a, **_k: None)


def test_a_roll_stops_before_its_next_pair_once_the_fleet_lock_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _steps_pass(monkeypatch)
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    reasons = iter([None] * len(restart.PHASES) + [LOST])  # asked before each step
    reports = restart.restart_pairs(ops, ops.source.pairs(), lambda: next(reasons))
    assert [r.ok for r in reports] == [True, False]
    assert reports[1].error == (
        f"drain: stopped before it: this restart no longer holds the fleet restart lock ({LOST}); "
        "another restarter may be working on the fleet"
    )
    assert not any("pd1" in " ".join(u) for _, u in sd.jobs)  # pd1 untouched
    assert not any("pd1" in c for c in gw.calls)


def test_a_restart_that_loses_the_fleet_lock_mid_pair_stops_before_its_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paused past the ttl between stop and start: it never starts the pair another holder
    may be restarting now, and says the pair stays out of the gateway."""
    _steps_pass(monkeypatch)
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    reasons = iter([None, None, LOST])  # drain, stop, then lost before start
    rep = restart.restart_pair(ops, ops.source.pairs()[0], lock_lost=lambda: next(reasons))
    assert not rep.ok and (rep.error or "").startswith("start: stopped before it: this restart")
    assert "(the pair stays out of the gateway)" in (rep.error or "")
    assert [v for v, _ in sd.jobs] == ["stop"]
    assert list(rep.phases) == ["drain", "stop"]


def test_a_failing_canary_keeps_the_pair_out(monkeypatch: pytest.MonkeyPatch) -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(
        restart.pdclient,
        "pair_canary",
        lambda *a, **k: CanaryResult(False, 1, 1, None, "decode answered HTTP 500"),
    )
    ops = fake_ops(sd, gw)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[:1])
    assert not rep.ok and rep.error is not None
    assert rep.error.startswith("canary: no request passed in 0s: decode answered HTTP 500")
    assert gw.calls == ["remove http://10.0.0.1:30000", "remove http://10.0.0.1:30001"]


def test_a_successful_restart_reregisters_both(monkeypatch: pytest.MonkeyPatch) -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(
        restart.pdclient, "pair_canary", lambda *a, **k: CanaryResult(True, 1, 0, 0.01)
    )
    ops = fake_ops(sd, gw)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[1:])
    assert rep.ok and list(rep.phases) == list(restart.PHASES)
    # Bound to each other: smg combines a prefill only with decodes of its pairing protocol.
    pair_id = ops.source.pairs()[1].id
    assert sorted(gw.calls[-2:]) == [
        f"add http://10.0.0.1:30010 pairing {pair_id}",
        f"add http://10.0.0.1:30011 pairing {pair_id}",
    ]
    assert [j for j, _ in sd.jobs] == ["stop", "reset-failed", "start"]


def test_restart_drains_and_registers_at_every_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    sd, gws = FakeSystemd(), [FakeGateway("http://gw1:8000"), FakeGateway("http://gw2:8000")]
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(
        restart.pdclient, "pair_canary", lambda *a, **k: CanaryResult(True, 1, 0, 0.01)
    )
    ops = fake_ops(sd, *gws)
    pair = ops.source.pairs()[0]
    (rep,) = restart.restart_pairs(ops, [pair])
    assert rep.ok, rep.error
    for gw in gws:
        assert sorted(gw.calls) == [
            f"add http://10.0.0.1:30000 pairing {pair.id}",
            f"add http://10.0.0.1:30001 pairing {pair.id}",
            "remove http://10.0.0.1:30000",
            "remove http://10.0.0.1:30001",
        ]
    assert "remove both from each gateway (http://gw1:8000, http://gw2:8000)" in "\n".join(
        restart.plan_lines(ops, [pair])
    )


def _restart_with_engine_counts(
    monkeypatch: pytest.MonkeyPatch, counts: dict[str, list[int | None]], drain: float
) -> tuple[FakeSystemd, list[str], list[str]]:
    """Restart pd0 while its engines report `counts` in turn (the last repeats); the systemd
    jobs, what was said, and each poll's URL."""
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(
        restart.pdclient, "pair_canary", lambda *a, **k: CanaryResult(True, 1, 0, 0.01)
    )
    sd, said, polls = FakeSystemd(), [], []
    ops = fake_ops(sd, FakeGateway())
    ops.say, ops.timeouts = said.append, replace(ops.timeouts, drain=drain)

    def in_flight(url: str) -> int | None:
        assert sd.jobs == [], "an engine was polled after the stop"
        polls.append(url)
        left = counts.get(url, [0])
        return left.pop(0) if len(left) > 1 else left[0]

    ops.in_flight = in_flight
    (rep,) = restart.restart_pairs(ops, [ops.source.pairs()[0]])
    assert rep.ok, rep.error
    return sd, said, polls


def test_the_drain_waits_for_the_engines_own_in_flight_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """smg's `load` stays 0 for streamed requests: the stop waits until both engines say 0."""
    decode = "http://10.0.0.1:30001"
    sd, said, polls = _restart_with_engine_counts(monkeypatch, {decode: [2, 1, 0]}, drain=30)
    assert polls.count(decode) == 3
    assert sd.jobs[0][0] == "stop"
    assert not [line for line in said if "still in flight" in line]


def test_a_drain_that_times_out_names_the_busy_engine_and_stops_anyway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decode, prefill = "http://10.0.0.1:30001", "http://10.0.0.1:30000"
    sd, said, _ = _restart_with_engine_counts(
        monkeypatch, {decode: [3], prefill: [None]}, drain=0.1
    )
    (line,) = [line for line in said if "still in flight" in line]
    assert f"({decode}: 3)" in line and prefill not in line  # unanswered: nothing to wait for
    assert sd.jobs[0][0] == "stop"


def test_an_unreachable_gateway_during_drain_stops_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sd, up, down = FakeSystemd(), FakeGateway("http://gw1:8000"), Unreachable("http://gw2:8000")
    ops = fake_ops(sd, up, down)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs())
    assert not rep.ok and rep.error is not None
    assert rep.error.startswith("drain: gateway http://gw2:8000: ConnectionError: refused")
    assert rep.error.endswith("nothing was stopped")
    assert sd.jobs == [] and up.calls == []  # not even the reachable gateway drained it


def test_recovery_skips_an_unreachable_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken pair is restarted even when a gateway is down; that gateway registers every
    pair itself when it starts again."""
    sd, up, down = FakeSystemd(), FakeGateway("http://gw1:8000"), Unreachable("http://gw2:8000")
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(
        restart.pdclient, "pair_canary", lambda *a, **k: CanaryResult(True, 1, 0, 0.01)
    )
    said: list[str] = []
    ops = fake_ops(sd, up, down)
    ops.say = said.append
    rep = restart.restart_pair(ops, ops.source.pairs()[0], drain_required=False)
    assert rep.ok, rep.error
    assert sum(c.startswith("add") for c in up.calls) == 2
    assert any("cannot drain (gateway http://gw2:8000" in line for line in said)
    assert any("cannot register (gateway http://gw2:8000" in line for line in said)


class Holding(FakeGateway):
    """A gateway that lists `held`."""

    def __init__(self, url: str, *held: GatewayWorker) -> None:
        super().__init__(url)
        self.held = list(held)

    def workers(self) -> list[GatewayWorker]:
        return self.held


PD0_PREFILL = GatewayWorker("a", "http://10.0.0.1:30000", "prefill", "ready", True, 0, "node-a/pd0")


def test_register_adds_what_a_gateway_lacks_and_leaves_the_rest() -> None:
    held = Holding(
        "http://gw1:8000",
        PD0_PREFILL,
        GatewayWorker("b", "http://10.0.0.1:30001", "decode", "ready", True, 0, None),
        GatewayWorker("c", "http://10.0.0.1:30010", "prefill", "draining", True, 1, None),
    )
    fresh = FakeGateway("http://gw2:8000")
    ops = fake_ops(FakeSystemd(), held, fresh)
    done = restart.register_gateways(ops, (), timeout=1)
    assert [(d.host, d.error) for d in done] == [("node-a", None), ("router-2", None)]
    assert done[0].workers == {
        "http://10.0.0.1:30000": "bound",
        "http://10.0.0.1:30001": "unbound (pairing none)",
        "http://10.0.0.1:30010": "draining",
        "http://10.0.0.1:30011": "added",
    }
    assert held.calls == ["add http://10.0.0.1:30011 pairing node-a/pd1"]
    assert set(done[1].workers.values()) == {"added"}
    assert sorted(fresh.calls) == [
        "add http://10.0.0.1:30000 pairing node-a/pd0",
        "add http://10.0.0.1:30001 pairing node-a/pd0",
        "add http://10.0.0.1:30010 pairing node-a/pd1",
        "add http://10.0.0.1:30011 pairing node-a/pd1",
    ]
    (only,) = restart.register_gateways(ops, ("router-2",), timeout=1)
    assert only.url == "http://gw2:8000"
    with pytest.raises(PdctlError, match="no gateway on 'gw9'; gateways run on: node-a, router-2"):
        restart.register_gateways(ops, ("gw9",), timeout=1)


def test_register_removes_workers_of_pairs_that_left_the_topology() -> None:
    gw = Holding(
        "http://gw1:8000",
        PD0_PREFILL,
        GatewayWorker("x", "http://10.0.0.9:30020", "prefill", "ready", True, 0, "pd2"),
        GatewayWorker("y", "http://10.0.0.9:30021", "decode", "draining", True, 0, "pd2"),
    )
    ops = fake_ops(FakeSystemd(), gw)
    (done,) = restart.register_gateways(ops, (), timeout=1)
    assert done.workers["http://10.0.0.9:30020"] == "removed"
    assert "http://10.0.0.9:30021" not in done.workers  # being drained: smg removes it
    assert gw.calls[0] == "remove http://10.0.0.9:30020"
    assert sorted(gw.calls[1:]) == [
        "add http://10.0.0.1:30001 pairing node-a/pd0",
        "add http://10.0.0.1:30010 pairing node-a/pd1",
        "add http://10.0.0.1:30011 pairing node-a/pd1",
    ]
    # Re-registering one pair after its restart never removes the others.
    gw.calls.clear()
    restart.register_pair(ops, ops.source.pairs()[1])
    assert not any(c.startswith("remove") for c in gw.calls)


def test_register_waits_until_drained_entries_are_gone_or_bound_again() -> None:
    url = "http://10.0.0.1:30000"
    settled = gateway.settled([url], "node-a/pd0")

    def held(status: str, pairing: str | None) -> list[GatewayWorker]:
        return [GatewayWorker("a", url, "prefill", status, True, 0, pairing)]

    assert settled([])  # removed: POST /workers would be accepted
    assert not settled(held("draining", "node-a/pd0"))  # smg would answer 409
    assert settled(held("ready", "node-a/pd0"))  # a gateway restart registered it already
    assert not settled(held("ready", None))  # unbound: must be drained first


def test_register_waits_bounded_for_a_gateway_that_does_not_answer() -> None:
    ops = fake_ops(FakeSystemd(), Unreachable("http://gw1:8000"))
    (d,) = restart.register_gateways(ops, (), timeout=0.3)
    assert d.workers == {} and d.error is not None
    assert d.error == "gateway http://gw1:8000: ConnectionError: refused (still, after 0s)"


# ----- doctor ---------------------------------------------------------------------------
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
        insts.append(InstanceStatus(inst, unit, None, probe, worker))
    canary = CanaryResult(
        canary_ok, 8, 0 if canary_ok else 5, None, None if canary_ok else "decode answered HTTP 500"
    )
    return Status(
        insts,
        [PairStatus(f"node-a/{p}", f"pdstack-{p}.target", canary) for p in pairs],
        [GatewayStatus("http://gw", True, "ready", CanaryResult(True, 1, 0, 0.01))],
        viewed_from="http://gw",
        views={"http://gw": {i.instance.url: i.gateway for i in insts if i.gateway}},
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
    assert "5/8 canary requests failed while both sides answer /health" in f.message
    assert f.fix == "run pdctl restart --both --pair node-a/pd0"
    (f,) = doctor.pair_findings(_status(False, decode_health="HTTP 503"))
    assert f.id == "live-pair-down" and "pd0-decode does not answer /health" in f.message
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


def test_a_degraded_pair_fails_verification_after_a_lucky_first_canary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "ok"))

    def half(*_a: Any, **_k: Any) -> CanaryResult:
        count = _a[3] if len(_a) > 3 else _k.get("count", 1)
        if count == 1:
            return CanaryResult(True, 1, 0, 0.01)
        return CanaryResult(False, count, 3, 0.01, "decode answered HTTP 500")

    monkeypatch.setattr(restart.pdclient, "pair_canary", half)
    ops = fake_ops(sd, gw)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[:1])
    assert not rep.ok and (rep.error or "").startswith("verify: 3/5 requests failed")
    assert not any(c.startswith("add") for c in gw.calls)


# ----- gateway admin --------------------------------------------------------------------
def test_gateway_key_from_env_or_the_gateway_env_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env_file = tmp_path / "gateway.env"
    env_file.write_text("# managed\nPDSTACK_GATEWAY_API_KEY=k-from-file\n")
    monkeypatch.setattr(gateway, "KEY_FILES", (tmp_path / "unreadable" / "gateway.env", env_file))
    monkeypatch.delenv(gateway.KEY_VAR, raising=False)
    assert gateway.api_key() == "k-from-file"
    monkeypatch.setenv(gateway.KEY_VAR, "k-from-env")
    assert gateway.api_key() == "k-from-env"
    monkeypatch.delenv(gateway.KEY_VAR)
    env_file.unlink()
    assert gateway.api_key() is None


@dataclass
class FakeResponse:
    status_code: int
    body: Any = None
    text: str = ""

    def json(self) -> Any:
        return self.body


def test_gateway_admin_sends_the_key_and_explains_a_401(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, dict[str, str]]] = []
    answers = [
        FakeResponse(
            200,
            {
                "workers": [
                    {
                        "id": "w1",
                        "url": "http://a:1",
                        "worker_type": "decode",
                        "status": "ready",
                        "is_healthy": True,
                        "load": 2,
                    },
                    {  # a DELETE sent already: a second one would start a second removal
                        "id": "w2",
                        "url": "http://b:3",
                        "worker_type": "prefill",
                        "status": "draining",
                        "is_healthy": True,
                        "load": 0,
                    },
                ]
            },
        ),
        FakeResponse(202),
        FakeResponse(401),
    ]

    def fake_request(method: str, url: str, headers: dict[str, str], **_: Any) -> FakeResponse:
        seen.append((method, url, headers))
        return answers.pop(0)

    monkeypatch.setattr(gateway.requests, "request", fake_request)
    gw = gateway.GatewayAdmin("http://gw:8000/", api_key="sekrit")
    gw.remove(["http://a:1", "http://b:3", "http://not-registered:2"])
    assert [(m, u) for m, u, _ in seen] == [
        ("GET", "http://gw:8000/workers"),
        ("DELETE", "http://gw:8000/workers/w1"),
    ]
    assert seen[0][2] == {"Authorization": "Bearer sekrit"}
    with pytest.raises(
        gateway.GatewayError, match="needs the API key: set PDSTACK_GATEWAY_API_KEY"
    ):
        gw.workers()


def test_router_restart_waits_for_readiness_and_touches_no_engine() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    (rep,) = restart.restart_router(fake_ops(sd, gw))
    assert rep.ok and rep.lines == ["OK: node-a/gateway (pdstack-gateway.service)"]
    assert sd.jobs == [("restart", ("pdstack-gateway.service",))]
    assert gw.calls.count("readiness") == 3


def test_lone_restart_times_out_with_the_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    sd = FakeSystemd()
    monkeypatch.setattr(restart, "probe_engine", lambda url: EngineProbe(url, "HTTP 503"))
    ops = fake_ops(sd, FakeGateway())
    rep = restart.restart_instance(ops, ops.source.instance("node-a/pd0-decode"))
    assert not rep.ok and rep.error == "health: not healthy after 0s"
    assert sd.jobs == [("restart", ("pdstack-pd0-decode.service",))]
    assert rep.lines[0].startswith("FAILED: node-a/pd0-decode")
    assert list(rep.journal) == ["pdstack-pd0-decode.service"]


def test_drift_between_the_running_process_and_its_units_execstart() -> None:
    class Drifted(FakeSystemd):
        def cmdline(self, pid: int) -> list[str]:
            return [
                "/opt/pdstack/venv/bin/python",
                "-m",
                "pdctl.sim",
                "--port",
                "30001",
                "--cuda-graph-max-bs-decode",
                "32",
            ]

    s = _status(True)
    unit = s.instances[1].unit
    assert unit is not None
    execstart = [
        "/usr/bin/numactl",
        "--cpunodebind=0",
        "/opt/pdstack/venv/bin/python",
        "-m",
        "pdctl.sim",
        "--port",
        "30001",
        "--cuda-graph-max-bs-decode",
        "64",
    ]
    s.instances[1] = InstanceStatus(
        s.instances[1].instance,
        UnitStatus(**{**unit.__dict__, "exec_start": execstart}),
        None,
        s.instances[1].probe,
        s.instances[1].gateway,
    )
    (f,) = doctor.drift_findings(fake_ops(Drifted(), FakeGateway()), s)
    assert f.id == "live-drift" and f.where == "node-a/pd0-decode"
    assert (
        "--cuda-graph-max-bs-decode: running 32, expected 64" in f.message
        and "its unit's ExecStart" in f.message
    )


# ----- recovery units -------------------------------------------------------------------
def test_engine_units_start_the_pairs_recovery_on_failure(
    load: Callable[..., Deployment], shipped: Callable[[str], dict[str, Any]]
) -> None:
    dep = load(shipped("sim"), hosts=["node-a"])
    for inst in dep.instances:
        unit = render.render_instance(inst, dep).unit
        assert "\nOnFailure=pdstack-recover@pd0.service\n" in unit
        assert "\nRestart=no\n" in unit  # systemd never restarts one side alone
    recover_unit = (
        render.jinja_env(ROOT / "roles/pdstack_engine/templates")
        .get_template("recover@.service.j2")
        .render(
            ansible_managed=render.MANAGED,
            venv=names.VENV,
            host="node-a",
            pending_dir=names.RESTART_PENDING_DIR,
        )
    )
    assert f"\nExecStart={names.VENV}/bin/pdctl recover --pair node-a/%i\n" in recover_unit
    # ProtectSystem=strict: the recovery removes the pair's restart-pending marker there.
    assert f"\nReadWritePaths=-{names.RESTART_PENDING_DIR}\n" in recover_unit
    assert "\nType=oneshot\n" in recover_unit


# ----- hardening: the lock, the recover state, Ctrl-C, drained pairs, junk answers ---------
def test_lock_never_opens_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    link = tmp_path / "restart.lock"
    link.symlink_to(victim)
    with pytest.raises(PdctlError, match="is a symbolic link; refusing"), lock.held("x", link):
        pass
    assert victim.read_text() == "root:x:0:0\n"  # not truncated


def test_lock_wait_reports_progress_then_gives_up(tmp_path: Path) -> None:
    path, said = tmp_path / "restart.lock", []
    with (
        lock.held("pdctl restart --both --pair pd0", path),
        pytest.raises(lock.LockHeld, match=r"after waiting 0\.05s") as e,
        lock.held("recover", path, wait=0.05, say=said.append, poll=0.01),
    ):
        pass
    assert e.value.exit_code == 3
    assert said[0].startswith(f"waiting for the restart lock: PID {os.getpid()} pdctl restart")
    with lock.held("recover", path, wait=5, say=said.append) as got:  # free: no wait
        assert got == lock.Acquired(0.0, None)


def test_recovery_log_keeps_other_pairs_and_files_private(tmp_path: Path) -> None:
    warned: list[str] = []
    log = RecoveryLog(tmp_path / "s" / "state.json", clock=lambda: 100.0, warn=warned.append)
    log.admit("a", RateLimit(2, 60))
    log.admit("b", RateLimit(2, 60))
    assert stat.S_IMODE((tmp_path / "s" / "state.json").stat().st_mode) == 0o600
    assert json.loads((tmp_path / "s" / "state.json").read_text()) == {"a": [100.0], "b": [100.0]}
    assert warned == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00junk", "Invalid JSON"),
        (b'{"p": [1, "soon"]}', "p.1: "),
        (b'{"p": 3}', "p: "),
        (b"x" * (2 << 20), "larger than"),
    ],
)
def test_recovery_log_resets_what_it_cannot_read(tmp_path: Path, content: bytes, why: str) -> None:
    warned: list[str] = []
    (tmp_path / "state.json").write_bytes(content)
    log = RecoveryLog(tmp_path / "state.json", warn=warned.append)
    assert log.recent("p", 60) == []
    (line,) = warned
    assert "is unreadable" in line and why in line and "starting it afresh" in line


def test_recovery_log_reads_no_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")  # O_NONBLOCK: opening it must not hang
    warned: list[str] = []
    assert RecoveryLog(tmp_path / "state.json", warn=warned.append).recent("p", 60) == []
    assert "not a regular file" in warned[0]


def test_ctrl_c_during_a_restart_names_the_pair_and_the_phase() -> None:
    class Interrupting(FakeSystemd):
        def start(self, *units: str) -> None:
            raise KeyboardInterrupt

    sd, gw = Interrupting(), FakeGateway()
    ops = fake_ops(sd, gw)
    with pytest.raises(restart.Interrupted) as e:
        restart.restart_pairs(ops, ops.source.pairs())
    msg = str(e.value)
    assert msg.startswith("interrupted during start of pair node-a/pd0: it is out of the gateway")
    assert "engines may be stopped or starting" in msg
    assert msg.endswith("Put it back with: pdctl restart --both --pair node-a/pd0")
    assert e.value.exit_code == 130
    assert gw.calls == ["remove http://10.0.0.1:30000", "remove http://10.0.0.1:30001"]


def test_collect_marks_a_pair_out_of_the_gateway_with_engines_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pdctl.ops import status

    t = topo(pairs=("pd0", "pd1", "pd2"))
    down = "http://10.0.0.1:30021"  # pd2's decode
    registered = {"http://10.0.0.1:30000", "http://10.0.0.1:30001"}  # pd0 only

    class Listing(FakeGateway):
        headers: ClassVar[dict[str, str]] = {}

        def readiness(self) -> tuple[bool, str]:
            return True, "ready"

        def workers(self) -> list[GatewayWorker]:
            return [GatewayWorker(u, u, "?", "ready", True, 0) for u in sorted(registered)]

    ok = CanaryResult(True, 1, 0, 0.01)
    monkeypatch.setattr(
        status, "probe_engine", lambda url: EngineProbe(url, "HTTP 503" if url == down else "ok")
    )
    monkeypatch.setattr(status, "group_canary", lambda *a, **k: ok)
    monkeypatch.setattr(status, "gateway_canary", lambda *a, **k: ok)
    ops = Ops(Source(t, None), lambda _h: FakeSystemd(), [Listing()])  # type: ignore[list-item]
    s = status.collect(ops, 1)
    assert [(p.id, p.gateway, p.drained) for p in s.pairs] == [
        ("node-a/pd0", "routed", False),
        ("node-a/pd1", "drained", True),
        ("node-a/pd2", "not routed", False),
    ]
    assert not s.healthy
    pairs = status_view.to_json(s)["pairs"]
    assert [p["drained"] for p in pairs] == [False, True, False]


def test_collect_reads_routing_from_every_gateway_that_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first gateway's host lost: routing comes from the others, not None; a pair that
    one answering gateway does not route is drained there, whatever another says."""
    from pdctl.ops import status

    t = topo(hosts=("node-a", "node-b"), pairs=("pd0",))
    everyone = [i.url for i in t.instances]
    routes = {"http://10.0.1.1:8000": everyone, "http://10.0.2.1:8000": everyone[2:]}

    class Down(FakeGateway):
        headers: ClassVar[dict[str, str]] = {}

        def readiness(self) -> tuple[bool, str]:
            raise gateway.GatewayError("connection timed out")

    class Listing(Down):
        def readiness(self) -> tuple[bool, str]:
            return True, "ready"

        def workers(self) -> list[GatewayWorker]:
            return [GatewayWorker(u, u, "?", "ready", True, 0) for u in routes[self.url]]

    def collect(*others: str) -> status.Status:
        router = t.router.model_dump()
        more = [{**router, "host": f"gw{n}", "url": u} for n, u in enumerate(others)]
        fleet = Topology.model_validate({**t.model_dump(), "gateways": [router, *more]})
        admins = [Down(t.router.url), *(Listing(u) for u in others)]
        ops = Ops(Source(fleet, None), lambda _h: FakeSystemd(), admins)  # type: ignore[arg-type]
        return status.collect(ops, 1)

    ok = CanaryResult(True, 1, 0, 0.01)
    monkeypatch.setattr(status, "probe_engine", lambda url: EngineProbe(url, "ok"))
    monkeypatch.setattr(status, "group_canary", lambda *a, **k: ok)
    monkeypatch.setattr(status, "gateway_canary", lambda *a, **k: ok)
    s = collect("http://10.0.1.1:8000")
    assert s.viewed_from == "http://10.0.1.1:8000"
    assert [g.ready for g in s.gateways] == [False, True]
    assert [p.gateway for p in s.pairs] == ["routed", "routed"]
    assert all(i.gateway is not None for i in s.instances)
    # A third gateway routes only node-b's pair: node-a's pair is drained.
    s = collect("http://10.0.1.1:8000", "http://10.0.2.1:8000")
    assert [p.gateway for p in s.pairs] == ["drained", "routed"]


def test_an_engine_answering_html_is_probed_without_a_crash(
    fake_http: Callable[..., Any],
) -> None:
    engine = fake_http({"*": (200, b"<html>proxy login</html>")})
    p = probe_engine(engine.url)
    assert p.healthy and p.running is None
    assert (p.metrics_error or "").startswith("/metrics is not Prometheus text")
    # the restart's health wait takes it as healthy (/health is 200) and moves on
    ops = fake_ops(FakeSystemd(), FakeGateway())
    pair = ops.source.pairs()[0]
    inst = pair.prefills[0].model_copy(update={"url": engine.url})
    dec = pair.decodes[0].model_copy(update={"url": engine.url})
    restart._wait_healthy(ops, FakeSystemd(), replace(pair, prefills=(inst,), decodes=(dec,)))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>", "not JSON: '<html>'"),
        (b'{"workers": [{"url": "http://a:1"}]}', "workers.0.id: Field required"),
        (b'{"workers": "all"}', "workers: Input should be a valid list"),
    ],
)
def test_gateway_listing_that_is_not_smgs(
    fake_http: Callable[..., Any], body: bytes, why: str
) -> None:
    gw = fake_http({"/workers": (200, body)})
    with pytest.raises(gateway.GatewayError) as e:
        gateway.GatewayAdmin(gw.url).workers()
    assert "GET /workers answered 200 but not smg's worker list" in str(e.value)
    assert why in str(e.value)


@pytest.mark.parametrize("body", [b"5", b'["text"]', b"<html>"])
def test_pair_canary_against_answers_that_are_no_generate_object(
    fake_http: Callable[..., Any], body: bytes
) -> None:
    engine = fake_http({"/generate": (200, body)})
    res = pair_canary(engine.url, engine.url, 1, count=2)
    assert not res.ok and res.failed == 2
    assert res.error is not None and res.error.startswith(("decode answered without", "decode:"))


# ----- status: the lock holder, concurrent probes, the view at 80 columns -------------------
def test_lock_holder_is_read_without_taking_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "restart.lock"
    assert lock.holder(path) is None  # no file yet
    before = time.time()
    with lock.held("pdctl restart --both --pair pd0", path):
        h = lock.holder(path)
        assert h is not None and h.pid == os.getpid()
        assert h.what == "pdctl restart --both --pair pd0"
        assert before - 1 <= h.since <= time.time() + 1
        with pytest.raises(lock.LockHeld), lock.held("second", path):
            pass  # reading it did not release it
    assert lock.holder(path) is None  # released: the line is gone
    # the line of a holder killed with SIGKILL stays in the file; no flock holds it
    dead = subprocess.run(["python3", "-c", "import os; print(os.getpid())"], capture_output=True)
    path.write_text(f"{dead.stdout.decode().strip()} pdctl restart --both --all\n")
    assert lock.holder(path) is None
    path.write_text(f"{os.getpid()} pdctl restart --both --all\n")  # alive, but no flock
    assert lock.holder(path) is None


def _fleet_topology(urls: list[str], router_url: str) -> Topology:
    """topo() on two hosts with two pairs each, its engines at `urls` (8 of them)."""
    d = topo(hosts=("node-a", "node-b"), pairs=("pd0", "pd1")).model_dump(mode="json")
    for inst, url in zip(d["instances"], urls, strict=True):
        inst["url"] = url
    d["router"]["url"] = router_url
    d["gateways"][0]["url"] = router_url  # the router is the first gateway
    return Topology.model_validate(d)


class _ListingGateway(FakeGateway):
    headers: ClassVar[dict[str, str]] = {}

    def readiness(self) -> tuple[bool, str]:
        return True, "ready"


def test_status_probes_run_at_once_and_bounded(
    fake_http: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pdctl.ops import status
    from tests.unit.conftest import InFlight

    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    in_flight = InFlight()
    routes = {"/health": (200, b""), "/metrics": (200, b""), "/generate": (200, b'{"text":"x"}')}
    engines = [fake_http(routes, delay=0.2, in_flight=in_flight) for _ in range(8)]
    gw = fake_http(routes, delay=0.2, in_flight=in_flight)
    t = _fleet_topology([e.url for e in engines], gw.url)
    ops = Ops(Source(t, None), lambda _h: FakeSystemd(), [_ListingGateway()])  # type: ignore[list-item]
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
    ops = Ops(Source(t, None), lambda _h: FakeSystemd(), [_ListingGateway()])  # type: ignore[list-item]
    status.collect(ops, 1)
    assert 1 < bounded.peak <= 3 * 2
    assert sum(len(e.seen) for e in engines) == 8 * 2 + 4 * 2  # health+metrics, canary legs


LONG_HOSTS = ("gpu-node-017.dc1.example.com", "gpu-node-018.dc1.example.com")


def _fleet_status(lock_holder: lock.Holder | None = None) -> Status:
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
        insts.append(InstanceStatus(inst, unit, None, probe, None if n == 5 else worker))
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
    return Status(insts, pairs, [gw], lock_holder, viewed_from=gw.url)


def _render(s: Status, width: int) -> list[str]:
    import io

    from rich.console import Console

    from pdctl.cli.status_view import view

    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(view(s))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 200])
def test_status_view_fits_the_terminal_and_cuts_nothing(width: int) -> None:
    holder = Holder(
        4242, "pdctl restart --both --pair gpu-node-017.dc1.example.com/pd1", time.time() - 75
    )
    lines = _render(_fleet_status(holder), width)
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines)
    assert "…" not in text and "..." not in text
    # hosts in order, each followed by its pairs, each pair by its two engines
    for host in LONG_HOSTS:
        assert host in lines
    a, b = lines.index(LONG_HOSTS[0]), lines.index(LONG_HOSTS[1])
    for block in (lines[a:b], lines[b : lines.index("gateways")]):
        heads = [
            line.split()[0]
            for line in block[1:]
            if line.startswith("  ") and not line.startswith("    ")
        ]
        assert heads == ["pd0", "pd1"]
        roles = [
            line.split()[0]
            for line in block
            if line.startswith("    ") and line.split()[0] in ("prefill", "decode")
        ]
        assert roles == ["prefill", "decode", "prefill", "decode"]
    assert "PID 1234567" in text and "1234.5 tok/s" in text and "KV 25%" in text
    assert "canary FAILED 2/3" in text and "[internal] KV transfer failed" in " ".join(text.split())
    assert "unreachable (ConnectionError: [Errno 111] refused)" in " ".join(text.split())
    assert f"drained: pdctl restart --both --pair {LONG_HOSTS[1]}/pd0" in text  # whole, one line
    assert "gateway not registered" in text
    assert "http://gateway.dc1.example.com:8000  ready  request ok 0.050s" in text
    assert "NOT HEALTHY  4 pairs on 2 hosts, 1 gateway" in text
    assert "restart lock:  held by PID 4242 for 1m15s" in text
    assert f"pdctl restart --both --pair {LONG_HOSTS[0]}/pd1" in text
    if width == 200:  # wide: one line per engine
        assert len([line for line in lines if line.startswith("    ")]) == 8


def test_status_view_says_the_lock_is_free_or_unreadable() -> None:
    assert "restart lock:  free" in _render(_fleet_status(), 80)
    error = "cannot read the restart lock /run/x: Permission denied"
    text = " ".join(" ".join(_render(replace(_fleet_status(), lock_error=error), 80)).split())
    assert f"restart lock: {error}" in text


def test_status_view_names_the_fleet_lock_holder() -> None:
    what = "pdctl restart --both --pair pdf1/pd0"
    live = Holder(4242, what, time.time() - 75, "pdf1", 5.0, 30.0)
    text = " ".join(" ".join(_render(_fleet_status(live), 80)).split())
    assert f"restart lock: held by pdf1 PID 4242 for 1m15s {what}" in text


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
    s = replace(_fleet_status(), lock_store=store.describe())
    assert doctor.lock_findings(ops, s) == []
    error = "cannot read: etcd has no quorum: 1 of 3 members answer"
    (down,) = doctor.lock_findings(ops, replace(s, lock_error=error))
    assert (down.id, down.severity, down.where) == ("live-fleet-lock", "error", store.describe())
    assert down.message.startswith(error) and "recoveries wait" in down.message
    History(store).start("pdctl restart --all")  # and then its holder was killed
    (lost,) = doctor.lock_findings(ops, s)
    assert (lost.id, lost.severity) == ("live-fleet-lock-lost", "warning")
    assert "pdctl restart --all lost the fleet restart lock before it finished" in lost.message


def test_status_view_says_an_unreachable_hosts_systemd_error_once() -> None:
    s = _fleet_status()
    host = LONG_HOSTS[1]
    down = [
        replace(i, unit=None, unit_error=f"{host}: unreachable: `systemctl show {i.instance.unit}`")
        if i.instance.host == host
        else i
        for i in s.instances
    ]
    lines = _render(replace(s, instances=down), 80)
    text = " ".join(" ".join(lines).split())
    assert text.count(f"{host}: unreachable") == 1  # once under the host, not per engine
    assert (
        "systemd: " + f"{host}: unreachable: `systemctl show pdstack-pd0-prefill.service`" in text
    )
    assert "(and 3 more units)" in text
    assert sum("unit ?" in line for line in lines) == 4  # the engines of that host
    assert all(len(line) <= 80 for line in lines)
