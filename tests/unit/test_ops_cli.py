"""pdctl restart/status/recover/doctor at the CLI: refusals, prompts, exit codes, JSON.

The ops actions are replaced by recorders (their behaviour is covered by the module tests
and tests/integration/test_ops_restart.py); what is tested here is what the CLI decides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pdctl import topology
from pdctl.cli import main, ops_commands
from pdctl.lint import Finding, Severity
from pdctl.ops import lock
from pdctl.ops.canary import CanaryResult
from pdctl.ops.context import Ops
from pdctl.ops.probe import EngineProbe
from pdctl.ops.restart import Report
from pdctl.ops.source import Pair
from pdctl.ops.status import GatewayStatus, InstanceStatus, PairStatus, Status
from pdctl.ops.systemd import UnitStatus
from pdctl.spec import Deployment


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run(*args: str, input: str | None = None) -> Run:
    runner = CliRunner()
    with runner.isolation(input=input) as (out, err, _), pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["pdctl", *args])
        mp.setenv("COLUMNS", "200")
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return Run(code, out.getvalue().decode(), err.getvalue().decode())


@dataclass
class Calls:
    restarted: list[list[str]] = field(default_factory=list)
    routers: int = 0
    singles: list[str] = field(default_factory=list)


@pytest.fixture
def topo_file(
    tmp_path: Path, load: Callable[..., Deployment], shipped: Callable[[str], dict[str, Any]]
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
    topology.write(topology.from_deployment(load(profile, hosts=["node-a"])), path)
    return path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Calls]:
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    monkeypatch.delenv("PDSTACK_INVENTORY", raising=False)
    c = Calls()

    def pairs(_ops: Ops, chosen: list[Pair]) -> list[Report]:
        c.restarted.append([p.id for p in chosen])
        return [Report(p.id, lines=[f"OK: {i.id}" for i in p.instances]) for p in chosen]

    def router(_ops: Ops) -> Report:
        c.routers += 1
        return Report("gateway", lines=["OK: gateway"])

    def single(_ops: Ops, inst: Any) -> Report:
        c.singles.append(inst.id)
        return Report(inst.id, lines=[f"OK: {inst.id}"])

    monkeypatch.setattr(ops_commands, "restart_pairs", pairs)
    monkeypatch.setattr(ops_commands, "restart_router", router)
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
    assert "pair is likely degraded" in r.stderr


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
    assert "systemctl stop pdstack-pd1.target on node-a (both engines)" in r.stderr
    if input is not None:
        assert "Restart 1 pair(s) as above? [y/N]" in r.stderr
    if code == 0:
        assert "OK: node-a/pd1-prefill" in r.stdout and "OK: node-a/pd1-decode" in r.stdout
    else:
        assert "Aborted" in r.stderr


def test_router_restarts_only_the_gateway(topo_file: Path, calls: Calls) -> None:
    r = run("restart", "--router", "--yes", "--topology", str(topo_file))
    assert r.exit_code == 0, r.stderr
    assert (calls.routers, calls.restarted, calls.singles) == (1, [], [])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--both", "--pair", "pd9"], "unknown pair 'pd9'; valid pairs: node-a/pd0, node-a/pd1"),
        (["--both"], "name a pair with --pair NAME, or use --all"),
        (["--pair", "pd0"], "say what to restart: --both"),
        (["--both", "--router", "--all"], "say what to restart"),
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
    def failing(_ops: Ops, chosen: list[Pair]) -> list[Report]:
        return [
            Report(
                chosen[0].id,
                ok=False,
                error="health: pdstack-pd0-decode.service is failed (exit-code) while starting",
                lines=["OK: node-a/pd0-prefill", "FAILED: node-a/pd0-decode"],
                journal={"pdstack-pd0-decode.service": ["CUDA out of memory"]},
            )
        ]

    monkeypatch.setattr(ops_commands, "restart_pairs", failing)
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
        [InstanceStatus(inst, unit, None, probe, None)],
        [PairStatus("node-a/pd0", "pdstack-pd0.target", canary)],
        GatewayStatus("http://gw:8000", True, '{"status":"ready"}', CanaryResult(True, 1, 0, 0.01)),
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
        "router": {
            "host": "node-a",
            "url": "http://gw:8000",
            "metrics_url": "http://gw:29000",
            "unit": "pdstack-gateway.service",
        },
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
    assert inst["gateway"] is None
    assert out["pairs"][0]["canary"]["ok"] is ok
    assert out["gateway"]["ready"] is True


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
            "degraded pair: ...",
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

    def fake_restart(_ops: Ops, pair: Pair, drain_required: bool = True) -> Report:
        done.append(pair.id)
        assert drain_required is False  # a broken pair must not wait on the gateway
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
