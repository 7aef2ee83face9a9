"""pdctl restart/status/recover/doctor at the CLI: refusals, prompts, exit codes, JSON.

The ops actions are replaced by recorders (their behaviour is covered by the module tests
and tests/integration/test_ops_restart.py); what is tested here is what the CLI decides.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import topology
from pdctl.cli import ops_commands
from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Store
from pdctl.lint import Finding, Severity
from pdctl.ops import lock, restart
from pdctl.ops.context import Ops
from pdctl.ops.health import EngineProbe
from pdctl.ops.restart import Interrupted, Report
from pdctl.ops.source import Pair
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.pdclient import CanaryResult
from pdctl.spec import Deployment
from tests.conftest import ROOT, Run, one_pair_topology
from tests.conftest import run_pdctl as run


@dataclass
class Calls:
    restarted: list[list[str]] = field(default_factory=list)
    routers: int = 0
    singles: list[str] = field(default_factory=list)


@pytest.fixture
def topo_file(
    tmp_path: Path,
    load: Callable[..., Deployment],
    shipped: Callable[[str], dict[str, Any]],
    etcd_coord: topology.TopologyCoord,
) -> Path:
    profile = shipped("sim")
    pd0 = profile["layout"]["pairs"][0]
    profile["layout"]["pairs"].append(
        {
            "name": "pd1",
            "prefill": {**pd0["prefill"], "port": 30010, "bootstrap_port": 9008},
            "decode": {**pd0["decode"], "port": 30011},
        }
    )
    profile["hardware"]["gpu_count"] = 4
    profile["hardware"]["numa_gpus"] = {0: [0, 1, 2, 3]}
    profile["layout"]["pairs"][1]["prefill"]["gpus"] = [2]
    profile["layout"]["pairs"][1]["decode"]["gpus"] = [3]
    path = tmp_path / "topology.yaml"
    topo = topology.from_deployment(load(profile, hosts=["node-a"]))
    path.write_text(topology.dump(topo.model_copy(update={"coord": etcd_coord})))
    return path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Calls]:
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    monkeypatch.delenv("PDSTACK_INVENTORY", raising=False)
    c = Calls()

    def pairs(_ops: Ops, chosen: list[Pair], *_: Any) -> list[Report]:
        c.restarted.append([p.id for p in chosen])
        return [Report(p.id, lines=[f"OK: {i.id}" for i in p.instances]) for p in chosen]

    def router(_ops: Ops) -> list[Report]:
        c.routers += 1
        return [Report("gateway", lines=["OK: gateway"])]

    def single(_ops: Ops, inst: Any) -> Report:
        c.singles.append(inst.id)
        return Report(inst.id, lines=[f"OK: {inst.id}"])

    monkeypatch.setattr(restart, "restart_pairs", pairs)
    monkeypatch.setattr(ops_commands, "restart_gateways", router)
    monkeypatch.setattr(ops_commands, "restart_instance", single)
    yield c


def test_decode_alone_is_refused_with_the_reason(topo_file: Path, calls: Calls) -> None:
    r = run("restart", "--decode", "--pair", "pd0", "--yes", "--topology", str(topo_file))
    assert r.exit_code == 2
    assert "refusing to restart the decode alone" in r.stderr
    assert "degraded" in r.stderr and "--both" in r.stderr and "--force" in r.stderr
    assert calls.singles == []


def test_decode_alone_with_force_restarts_only_that_side(topo_file: Path, calls: Calls) -> None:
    r = run(
        "restart", "--decode", "--force", "--pair", "pd0", "--topology", str(topo_file), input="y\n"
    )
    assert r.exit_code == 0, r.stderr
    assert calls.singles == ["node-a/pd0-decode"]
    assert "group is likely degraded" in r.stderr


@pytest.mark.parametrize(
    ("args", "input", "code", "restarted"),
    [
        (["--pair", "pd1"], "y\n", 0, [["node-a/pd1"]]),
        (["--pair", "pd1"], "n\n", 1, []),
        (["--pair", "pd1", "--yes"], None, 0, [["node-a/pd1"]]),
        (["--all", "--yes"], None, 0, [["node-a/pd0", "node-a/pd1"]]),
    ],
)
def test_restart_both_confirms_listing_the_targets(
    topo_file: Path,
    calls: Calls,
    args: list[str],
    input: str | None,
    code: int,
    restarted: list[list[str]],
) -> None:
    r = run("restart", "--both", *args, "--topology", str(topo_file), input=input)
    assert r.exit_code == code, r.stderr
    assert calls.restarted == restarted
    assert "node-a/pd1: pdstack-pd1-prefill.service + pdstack-pd1-decode.service" in r.stderr
    assert (
        "systemctl stop pdstack-pd1.target pdstack-pd1-prefill.service "
        "pdstack-pd1-decode.service on node-a (returns once both engines are down)"
    ) in r.stderr
    if input is not None:
        assert "Restart 1 group(s) as above? [y/N]" in r.stderr
    if code == 0:
        assert "OK: node-a/pd1-prefill" in r.stdout and "OK: node-a/pd1-decode" in r.stdout
    else:
        assert "Aborted" in r.stderr


@pytest.mark.parametrize("flag", ["--gateways", "--router"])  # --router: its former name
def test_gateways_restarts_only_the_gateways(topo_file: Path, calls: Calls, flag: str) -> None:
    r = run("restart", flag, "--yes", "--topology", str(topo_file))
    assert r.exit_code == 0, r.stderr
    assert (calls.routers, calls.restarted, calls.singles) == (1, [], [])
    warned = "Warning: --router is deprecated and will be removed: use --gateways"
    assert (warned in r.stderr) is (flag == "--router")


@pytest.mark.parametrize(
    ("command", "former"),
    [("restart", "--router"), ("recover", "--lock-timeout"), ("capacity", "--router-policy")],
)
def test_former_option_names_are_hidden(command: str, former: str) -> None:
    r = run(command, "--help")
    assert r.exit_code == 0 and former not in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--both", "--pair", "pd9"], "unknown group 'pd9'; valid groups: node-a/pd0, node-a/pd1"),
        (["--both"], "name a group with --pair NAME, or use --all"),
        (["--pair", "pd0"], "say what to restart: --both"),
        (["--both", "--gateways", "--all"], "say what to restart"),
    ],
)
def test_bad_selections_say_what_is_valid(
    topo_file: Path, calls: Calls, args: list[str], message: str
) -> None:
    r = run("restart", *args, "--yes", "--topology", str(topo_file))
    assert r.exit_code == 2
    assert message in r.stderr
    assert calls.restarted == []


def test_no_topology_file_says_run_site_yml(tmp_path: Path, calls: Calls) -> None:
    r = run("status", "--topology", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2
    assert "no topology file at" in r.stderr and "Run site.yml" in r.stderr


def test_restart_refuses_while_another_holds_the_lock(topo_file: Path, calls: Calls) -> None:
    with lock.held("pdctl restart --both --pair pd0"):
        r = run("restart", "--both", "--all", "--yes", "--topology", str(topo_file))
    assert r.exit_code == 3
    assert "another restart is running: PID" in r.stderr
    assert calls.restarted == []


def test_failed_pair_exits_1_with_the_journal(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(_ops: Ops, chosen: list[Pair], *_: Any) -> list[Report]:
        return [
            Report(
                chosen[0].id,
                ok=False,
                error="health: pdstack-pd0-decode.service is failed (exit-code) while starting",
                lines=["OK: node-a/pd0-prefill", "FAILED: node-a/pd0-decode"],
                journal={"pdstack-pd0-decode.service": ["CUDA out of memory"]},
            )
        ]

    monkeypatch.setattr(restart, "restart_pairs", failing)
    r = run("restart", "--both", "--pair", "pd0", "--yes", "--topology", str(topo_file))
    assert r.exit_code == 1
    assert "FAILED: node-a/pd0-decode" in r.stdout
    assert "journalctl -u pdstack-pd0-decode.service" in r.stderr
    assert "CUDA out of memory" in r.stderr


def _status(ok: bool) -> Status:
    t = topology.Topology.model_validate(yaml_topology())
    inst = t.instances[0]
    unit = UnitStatus(inst.unit, "loaded", "active", "running", 4242, 1.0, 0, [])
    probe = EngineProbe(
        inst.url, "ok", running=3, queued=0, token_usage=0.25, cuda_graph=True, gen_throughput=120.5
    )
    canary = CanaryResult(
        ok, 3, 0 if ok else 2, 0.05 if ok else None, None if ok else "decode answered HTTP 500"
    )
    return Status(
        [InstanceStatus(inst, unit, None, probe, (None,))],
        [PairStatus("node-a/pd0", "pdstack-pd0.target", canary)],
        [GatewayStatus("http://gw:8000", True, "ready", CanaryResult(True, 1, 0, 0.01))],
        views={"http://gw:8000": {}},
    )


def yaml_topology() -> dict[str, Any]:
    return {
        "model": "sim",
        "engine": "sim",
        "instances": [
            {
                "id": "node-a/pd0-prefill",
                "host": "node-a",
                "name": "pd0-prefill",
                "pair": "pd0",
                "role": "prefill",
                "unit": "pdstack-pd0-prefill.service",
                "url": "http://10.0.0.1:30000",
                "numa_node": 0,
                "gpus": [0],
                "bootstrap_port": 8998,
            }
        ],
        "pairs": [],
        "gateways": [
            {
                "host": "node-a",
                "url": "http://gw:8000",
                "metrics_url": "http://gw:29000",
                "unit": "pdstack-gateway.service",
            }
        ],
    }


@pytest.mark.parametrize("ok", [True, False])
def test_status_json(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch, ok: bool
) -> None:
    monkeypatch.setattr(ops_commands, "collect", lambda _ops, _n: _status(ok))
    r = run("status", "--format", "json", "--topology", str(topo_file))
    assert r.exit_code == (0 if ok else 1)
    out = json.loads(r.stdout)
    assert out["healthy"] is ok
    (inst,) = out["instances"]
    assert inst["id"] == "node-a/pd0-prefill" and inst["pid"] == 4242
    assert inst["active"] == "active" and inst["health"] == "ok"
    assert (inst["running"], inst["token_usage"], inst["cuda_graph"]) == (3, 0.25, True)
    assert inst["gateways"] == {"http://gw:8000": None}  # listed its workers, not this one
    assert out["pairs"][0]["canary"]["ok"] is ok
    (gateway,) = out["gateways"]
    assert gateway["ready"] is True
    # scripts read these keys: the fleet view added one (restart_lock); the gateways are a
    # list, each engine's registration one entry per gateway (no "first gateway" key)
    assert list(out) == ["healthy", "instances", "pairs", "gateways", "restart_lock"]
    assert list(inst) == [
        "id", "pair", "role", "unit", "active", "sub", "pid", "uptime_s", "restarts",
        "unit_error", "health", "running", "queued", "token_usage", "cuda_graph",
        "gen_throughput", "metrics_error", "ready_path", "state", "url", "gateways",
    ]  # fmt: skip
    # ... and one per pair (restart_pending: null unless site.yml left a restart pending;
    # recovery: null unless its recovery waits; abandoned: null unless a restart of it died)
    assert list(out["pairs"][0]) == [
        "id", "target", "canary", "gateway", "drained", "restart_pending", "recovery",
        "abandoned",
    ]  # fmt: skip
    assert out["pairs"][0]["restart_pending"] is None and out["pairs"][0]["recovery"] is None
    assert out["pairs"][0]["abandoned"] is None
    assert list(gateway) == ["url", "ready", "detail", "canary", "view"]
    assert out["restart_lock"]["held"] is False


def test_status_table_names_the_failing_canary(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops_commands, "collect", lambda _ops, _n: _status(False))
    r = run("status", "--topology", str(topo_file))
    assert r.exit_code == 1
    assert "FAILED 2/3" in r.stdout and "decode answered HTTP 500" in r.stdout
    assert "not registered" in r.stdout and "4242" in r.stdout


def test_doctor_exit_codes_and_fix_lines(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = [
        Finding(
            "live-degraded-pair",
            Severity.ERROR,
            "node-a/pd0",
            "degraded group: ...",
            "run pdctl restart --both --pair node-a/pd0",
        )
    ]
    monkeypatch.setattr(ops_commands, "run_doctor", lambda _ops, _n: (found, None))
    r = run("doctor", "--topology", str(topo_file))
    assert r.exit_code == 2
    assert "ERROR live-degraded-pair [node-a/pd0]" in r.stdout
    assert "fix: run pdctl restart --both --pair node-a/pd0" in r.stdout
    monkeypatch.setattr(ops_commands, "run_doctor", lambda _ops, _n: ([], None))
    r = run("doctor", "--topology", str(topo_file))
    assert r.exit_code == 0 and "No problems found." in r.stdout


def test_recover_stops_after_the_rate_limit(
    topo_file: Path, tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[str] = []

    def fake_restart(_ops: Ops, pair: Pair, planned: bool = True, **_: Any) -> Report:
        done.append(pair.id)
        assert planned is False  # a broken pair must not wait on the gateway or its requests
        return Report(pair.id, lines=[f"OK: {pair.id}"])

    monkeypatch.setattr("pdctl.ops.recover.restart_pair", fake_restart)
    state = tmp_path / "recover.json"
    args = (
        "recover",
        "--pair",
        "pd0",
        "--max-recoveries",
        "2",
        "--window",
        "600",
        "--state",
        str(state),
        "--topology",
        str(topo_file),
    )
    assert [run(*args).exit_code for _ in range(2)] == [0, 0]
    r = run(*args)
    assert r.exit_code == 4
    assert "2 recoveries in the last 600s (limit 2)" in r.stderr
    assert "stays failed for the alert" in r.stderr
    assert done == ["node-a/pd0", "node-a/pd0"]


# ----- hostile and careless input: one line, never a traceback ------------------------------
def _one_error_line(r: Run, code: int, *needles: str) -> None:
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, r.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_binary_topology_file(tmp_path: Path, calls: Calls) -> None:
    path = tmp_path / "topology.yaml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 50)
    r = run("status", "--topology", str(path))
    _one_error_line(r, 2, str(path), "not UTF-8 text")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["pairs"][0].update(decode="node-a/pd9-decode"), "pairs[0].decode: names"),
        (
            lambda t: t["pairs"][0].update(prefill=t["pairs"][0]["decode"]),
            "pairs[0].prefill: 'node-a/pd0-decode' is a decode instance",
        ),
    ],
)
def test_topology_pair_naming_a_missing_instance(
    topo_file: Path, calls: Calls, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = yaml.safe_load(topo_file.read_text())
    edit(data)
    topo_file.write_text(yaml.safe_dump(data))
    for command in ("status", "doctor"):
        _one_error_line(run(command, "--topology", str(topo_file)), 2, message)


@pytest.mark.parametrize("count", ["0", "-3"])
def test_canaries_below_one_are_refused(topo_file: Path, calls: Calls, count: str) -> None:
    for command in ("status", "doctor"):
        r = run(command, "--canaries", count, "--topology", str(topo_file))
        assert r.exit_code == 2
        assert "Invalid value for '--canaries'" in r.stderr and "x>=1" in r.stderr


class UpSystemd:
    """Every unit active; restart jobs recorded."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, ...]] = []

    def show(self, unit: str) -> UnitStatus:
        return UnitStatus(unit, "loaded", "active", "running", 7, None, 0, [])

    def __getattr__(self, verb: str) -> Callable[..., None]:
        return lambda *units: self.jobs.append((verb, *units))

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        return []

    def cmdline(self, pid: int) -> list[str]:
        return []


@pytest.fixture
def junk_stack(
    tmp_path: Path,
    fake_http: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    etcd_coord: topology.TopologyCoord,
) -> tuple[Path, UpSystemd]:
    """Engines and a gateway that answer 200 with an HTML page to everything; the real ops
    (no recorders) against a fake systemd, and a real fleet restart lock."""
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    monkeypatch.delenv("PDSTACK_INVENTORY", raising=False)
    page = (200, b"<html><body>It works!</body></html>")
    engine, gw = fake_http({"*": page}), fake_http({"*": page})
    path = tmp_path / "junk-topology.yaml"
    topo = one_pair_topology(
        "node-a",
        engine.url,
        engine.url,
        bootstrap_port=1,
        gateway_url=gw.url,
        metrics_url=gw.url + "/metrics",
    )
    path.write_text(topology.dump(topo.model_copy(update={"coord": etcd_coord})))
    sd = UpSystemd()
    monkeypatch.setattr("pdctl.ops.context.for_host", lambda _host, _addr, _ssh: sd)
    return path, sd


def test_status_and_doctor_survive_non_json_engines_and_gateway(
    junk_stack: tuple[Path, UpSystemd],
) -> None:
    path, _ = junk_stack
    r = run("status", "--format", "json", "--topology", str(path), "--canaries", "1")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    out = json.loads(r.stdout)
    assert (
        "GET /workers answered 200 but not smg's worker list (not JSON"
        in (out["gateways"][0]["detail"])
    )
    assert all(i["health"] == "ok" for i in out["instances"])  # /health 200 is healthy
    assert all("/metrics is not Prometheus text" in i["metrics_error"] for i in out["instances"])
    assert "JSONDecodeError" in out["pairs"][0]["canary"]["error"]
    assert out["pairs"][0]["gateway"] is None  # the gateway's view is unknown


def test_status_names_the_restart_lock_holder(
    junk_stack: tuple[Path, UpSystemd], etcd_coord: topology.TopologyCoord
) -> None:
    path, _ = junk_stack
    fleet = RestartLock(Store(etcd_coord), 30)
    with lock.held("pdctl restart --both --pair node-a/pd0", fleet=fleet):
        r = run("status", "--format", "json", "--topology", str(path), "--canaries", "1")
        table = run("status", "--topology", str(path), "--canaries", "1")
    held = json.loads(r.stdout)["restart_lock"]
    assert (held["held"], held["pid"], held["host"]) == (True, os.getpid(), socket.gethostname())
    assert held["command"] == "pdctl restart --both --pair node-a/pd0"
    assert 0 <= held["held_s"] < 600 and held["error"] is None
    assert (held["store"], held["ttl_s"]) == (f"etcd ({etcd_coord.endpoints[0]})", 30)
    assert 0 <= held["heartbeat_age_s"] < 30
    assert f"restart lock:  held by {socket.gethostname()} PID {os.getpid()} for " in table.stdout
    assert "pdctl restart --both --pair node-a/pd0" in table.stdout
    r = run("status", "--format", "json", "--topology", str(path), "--canaries", "1")
    assert json.loads(r.stdout)["restart_lock"]["held"] is False  # released
    r = run("doctor", "--topology", str(path), "--canaries", "1")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert "ERROR live-gateway" in r.stdout and "not smg's worker list" in r.stdout
    assert "live-unregistered" not in r.stdout  # not claimed while the gateway is unreadable


def test_restart_with_a_non_json_gateway_stops_nothing(
    junk_stack: tuple[Path, UpSystemd],
) -> None:
    path, sd = junk_stack
    r = run("restart", "--both", "--pair", "pd0", "--yes", "--topology", str(path))
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "drain: gateway" in r.stderr and "not smg's worker list" in r.stderr
    assert "nothing was stopped" in r.stderr
    assert sd.jobs == []


def test_ctrl_c_mid_restart_names_the_drained_pair_and_the_way_back(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(_ops: Ops, chosen: list[Pair], *_: Any) -> list[Report]:
        raise Interrupted(chosen[0].id, "health")

    monkeypatch.setattr(restart, "restart_pairs", interrupted)
    r = run("restart", "--both", "--pair", "pd0", "--yes", "--topology", str(topo_file))
    _one_error_line(
        r,
        130,
        "interrupted during health of group node-a/pd0",
        "out of the gateway (drained)",
        "Put it back with: pdctl restart --both --pair node-a/pd0",
    )


def test_status_shows_a_drained_pair(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _status(True)
    s.pairs[0] = PairStatus("node-a/pd0", "pdstack-pd0.target", s.pairs[0].canary, "drained")
    monkeypatch.setattr(ops_commands, "collect", lambda _ops, _n: s)
    r = run("status", "--topology", str(topo_file))
    assert r.exit_code == 1  # a pair the gateway does not route to is not healthy
    assert "drained: pdctl restart --both --pair node-a/pd0" in r.stdout
    r = run("status", "--format", "json", "--topology", str(topo_file))
    pair = json.loads(r.stdout)["pairs"][0]
    assert (pair["gateway"], pair["drained"]) == ("drained", True)


# ----- recover: the state folder, a corrupt state file, the lock ----------------------------
@pytest.fixture
def recovered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    done: list[str] = []

    def fake_restart(_ops: Ops, pair: Pair, planned: bool = True, **_: Any) -> Report:
        done.append(pair.id)
        return Report(pair.id, lines=[f"OK: {pair.id}"])

    monkeypatch.setattr("pdctl.ops.recover.restart_pair", fake_restart)
    return done


def _recover(topo_file: Path, state: Path, *extra: str) -> Run:
    return run(
        "recover", "--pair", "pd0", "--state", str(state), "--topology", str(topo_file), *extra
    )


def test_recover_resets_a_corrupt_state_file_with_a_warning(
    topo_file: Path, tmp_path: Path, calls: Calls, recovered: list[str]
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state = state_dir / "recover.json"
    for junk in (b"\x00\xff binary", b'{"node-a/pd0": "yesterday"}', b"[1, 2]", b'{"p": [1e999]}'):
        state.write_bytes(junk)
        r = _recover(topo_file, state)
        assert r.exit_code == 0, r.stderr
        assert "Warning: recover state" in r.stderr and "starting it afresh" in r.stderr
        assert "Traceback" not in r.stderr
    assert recovered == ["node-a/pd0"] * 4
    (stamp,) = json.loads(state.read_text())["node-a/pd0"]  # rewritten, valid again
    assert isinstance(stamp, float)
    assert "node-a/pd0: recovered: restarted prefill and decode together" in r.stderr


def test_recover_creates_a_missing_state_folder_or_says_why_not(
    topo_file: Path, tmp_path: Path, calls: Calls, recovered: list[str]
) -> None:
    state = tmp_path / "new" / "recover.json"
    assert _recover(topo_file, state).exit_code == 0
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    r = _recover(topo_file, tmp_path / "no" / "such" / "recover.json")
    _one_error_line(r, 2, "state folder", "cannot create it (No such file or directory)")
    assert recovered == ["node-a/pd0"]


def test_a_failed_recovery_exits_6_which_systemd_tries_again_within_the_rate_limit(
    topo_file: Path, tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recover unit's RestartPreventExitStatus= holds 1 2 4, not 6: a restart that
    failed after a crash is tried again, each try counted, until the rate limit (exit 4)."""

    def failed(_ops: Ops, pair: Pair, planned: bool = True, **_: Any) -> Report:
        return Report(pair.id, ok=False, error="canary: no request passed in 120s")

    monkeypatch.setattr("pdctl.ops.recover.restart_pair", failed)
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state = state_dir / "recover.json"
    codes = [_recover(topo_file, state, "--max-recoveries", "2").exit_code for _ in range(3)]
    assert codes == [6, 6, 4]
    unit = (ROOT / "roles/pdstack_engine/templates/recover@.service.j2").read_text()
    (prevent,) = [ln for ln in unit.splitlines() if ln.startswith("RestartPreventExitStatus=")]
    assert "6" not in prevent.split("=")[1].split() and "4" in prevent


@pytest.mark.parametrize("unsafe", ["group-writable", "other owner", "symlink"])
def test_recover_refuses_a_state_folder_others_can_write(
    topo_file: Path, tmp_path: Path, calls: Calls, recovered: list[str], unsafe: str
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    if unsafe == "group-writable":
        state_dir.chmod(0o770)
        needle = "writable by group or others (mode 0770)"
    elif unsafe == "other owner":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(state_dir, 65534, 65534)
        needle = "is owned by UID 65534"
    else:
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        state_dir.rmdir()
        state_dir.symlink_to(real)
        needle = "a symbolic link"
    r = _recover(topo_file, state_dir / "recover.json")
    _one_error_line(r, 2, str(state_dir), needle)
    assert recovered == []


def test_recover_never_writes_through_a_planted_link(
    topo_file: Path, tmp_path: Path, calls: Calls, recovered: list[str]
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    state = state_dir / "recover.json"
    state.symlink_to(victim)
    r = _recover(topo_file, state)
    assert r.exit_code == 0 and "a symbolic link" in r.stderr
    assert victim.read_text() == "root:secret\n"
    assert not state.is_symlink() and "node-a/pd0" in json.loads(state.read_text())
    assert [p.name for p in state_dir.iterdir()] == ["recover.json"]  # no temp file left


def test_recover_waits_for_a_restart_holding_the_lock(
    topo_file: Path,
    tmp_path: Path,
    calls: Calls,
    recovered: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    saw_wait, release = threading.Event(), threading.Event()
    holder = lock._holder

    def noticed(fd: int) -> str:  # recover found the lock held: let the holder finish
        who = holder(fd)
        saw_wait.set()
        return who

    monkeypatch.setattr(lock, "_holder", noticed)

    def hold() -> None:
        with lock.held("pdctl restart --both --all"):
            release.set()
            saw_wait.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    release.wait(30)
    r = _recover(topo_file, tmp_path / "state" / "recover.json", "--lock-wait", "60")
    t.join(30)
    assert r.exit_code == 0, r.stderr
    assert "waiting for the restart lock: PID" in r.stderr
    assert "pdctl restart --both --all" in r.stderr
    assert recovered == ["node-a/pd0"]
    assert "recovered: restarted prefill and decode together after waiting" in r.stderr


def test_recover_gives_up_after_the_lock_timeout_naming_the_holder(
    topo_file: Path, tmp_path: Path, calls: Calls, recovered: list[str]
) -> None:
    with lock.held("pdctl restart --both --pair pd1"):
        r = _recover(topo_file, tmp_path / "s" / "recover.json", "--lock-timeout", "0.2")
    _one_error_line(
        r, 3, f"PID {os.getpid()} pdctl restart --both --pair pd1 holds", "after waiting 0.2s"
    )
    # its former name still works, and says which to use
    assert "Warning: --lock-timeout is deprecated and will be removed: use --lock-wait" in r.stderr
    assert recovered == []


# ----- pdctl without ansible-core -----------------------------------------------------------
BLOCK_ANSIBLE = """
import sys
class _NoAnsible:
    def find_spec(self, name, path=None, target=None):
        if name == "ansible" or name.startswith("ansible."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoAnsible())
sys.argv = ["pdctl", *sys.argv[1:]]
from pdctl.cli import main
main()
"""


def test_without_ansible_core_only_inventory_commands_fail(
    topo_file: Path, write_deployment: Callable[..., Path], shipped: Callable[[str], Any]
) -> None:
    inventory = write_deployment(shipped("sim"))

    def pdctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", BLOCK_ANSIBLE, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    r = pdctl("validate", "-i", str(inventory))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("Error: ") == 1
    assert "needs ansible-core" in r.stderr and "pip install 'pdctl[controller]'" in r.stderr
    assert pdctl("--help").returncode == 0
    # From the topology file, no inventory: no Ansible needed.
    r = pdctl("restart", "--prefill", "--pair", "pd0", "--topology", str(topo_file))
    assert r.returncode == 2 and "refusing to restart the prefill alone" in r.stderr


# ----- restart --max-unavailable: bad input before anything, the budget passed on -----------
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-unavailable", "0"], "--max-unavailable 0: at least one group"),
        (["--max-unavailable", "150%"], "a percentage is at most 100%"),
        (["--max-unavailable", "two"], "give a count of groups (2) or a percentage"),
        (["--max-unavailable", ""], "--max-unavailable '': give a count of groups"),
        (["--max-unavailable", "3"], "--max-unavailable 3 is more than the fleet's 2 groups"),
        (["--min-serving", "2"], "--min-serving 2: the fleet has 2 groups, so none could"),
        (["--max-unavailable", "2", "--min-serving", "1"], "cannot both hold"),
        # the test topology's gateway does not run: the floor cannot be checked
        (["--max-unavailable", "1"], "no gateway answered, so the capacity floor cannot"),
    ],
)
def test_bad_roll_budgets_are_one_line_errors_before_anything_stops(
    topo_file: Path, calls: Calls, args: list[str], needle: str
) -> None:
    r = run("restart", "--both", "--all", "--yes", *args, "--topology", str(topo_file))
    _one_error_line(r, 2, needle)
    assert calls.restarted == []


def test_roll_options_go_with_both(topo_file: Path, calls: Calls) -> None:
    r = run(
        "restart", "--gateways", "--max-unavailable", "2", "--yes", "--topology", str(topo_file)
    )
    _one_error_line(r, 2, "--max-unavailable, --min-serving and --include-drained go with --both")
    assert calls.routers == 0


def test_a_roll_budget_reaches_the_roll_with_its_plan(
    topo_file: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[Any] = []

    def pairs(
        _ops: Ops, chosen: list[Pair], _lost: Any, budget: Any, _phases: Any = None
    ) -> list[Report]:
        got.append(budget)
        return [Report(p.id) for p in chosen]

    monkeypatch.setattr(restart, "restart_pairs", pairs)
    monkeypatch.setattr(ops_commands.roll, "prepare", lambda _o, chosen, *_: chosen[::-1])
    r = run(
        "restart", "--both", "--all", "--max-unavailable", "100%", "--yes",
        "--topology", str(topo_file),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert got == [ops_commands.roll.Budget(2, 0)]
    assert "1. group node-a/pd1" in r.stderr  # in the roll's order
    assert "Groups restart at most 2 at a time" in r.stderr
