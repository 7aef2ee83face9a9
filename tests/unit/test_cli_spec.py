"""`pdctl validate` and `pdctl plan` through the real entry point: output, exit codes, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
Shipped = Callable[[str], dict[str, Any]]
Write = Callable[..., Path]
Pdctl = Callable[..., Any]


def _with(profile: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    profile["engine"].setdefault(section, {}).update(values)
    return profile


@pytest.mark.parametrize("name", ["reference", "sim"])
def test_shipped_profiles_validate_clean(name: str, pdctl: Pdctl) -> None:
    inventory, profile = ROOT / "inventory.ini", ROOT / f"deploy/profiles/{name}.yml"
    run = pdctl("validate", "--strict", "-i", str(inventory), "-p", str(profile))
    assert run.exit_code == 0, run.stdout + run.stderr
    assert run.stdout.startswith("OK: no findings")


def test_warnings_pass_unless_strict(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    inventory = write_deployment(_with(shipped("reference"), "common", mem_fraction_static=0.61))
    run = pdctl("validate", "-i", str(inventory))
    assert run.exit_code == 0
    assert "memory-tight" in run.stdout and "errors: 0, warnings: 1" in run.stdout
    assert pdctl("validate", "--strict", "-i", str(inventory)).exit_code == 1


def test_errors_exit_2_with_table(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(_with(shipped("reference"), "decode", max_running_requests=128))
    run = pdctl("validate", "-i", str(inventory))
    assert run.exit_code == 2
    for text in ("decode-eager-fallback", "error", "gpu-node-1/pd0-decode", "errors: 1"):
        assert text in run.stdout
    assert "engine.decode.max_running_requests" in run.stdout


def test_validate_json(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    profile = _with(shipped("reference"), "decode", max_running_requests=128)
    _with(profile, "common", mem_fraction_static=0.61)
    run = pdctl("validate", "--format", "json", "-i", str(write_deployment(profile)))
    assert run.exit_code == 2
    out = json.loads(run.stdout)
    assert {f["id"] for f in out["findings"]} == {"decode-eager-fallback", "memory-tight"}
    assert set(out["findings"][0]) == {"id", "severity", "where", "message", "fix"}
    assert out["summary"] == {
        "errors": 1, "warnings": 1, "instances": 2, "hosts": 1, "exit_code": 2,
    }  # fmt: skip


def test_validate_two_hosts(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(shipped("reference"), hosts=["gpu-node-1", "gpu-node-2"])
    run = pdctl("validate", "--format", "json", "-i", str(inventory))
    assert run.exit_code == 0
    assert json.loads(run.stdout)["summary"]["instances"] == 4


def test_plan_reference(pdctl: Pdctl) -> None:
    run = pdctl("plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd0-decode")
    assert run.exit_code == 0, run.stderr
    for text in ("gpu-node-1/pd0-decode", "CUDA graphs (96 x 0.3)", "28.8", "1.94", "fits"):
        assert text in run.stdout
    assert "pd0-prefill" not in run.stdout


def test_plan_what_if_reproduces_the_seed_oom(pdctl: Pdctl) -> None:
    args = ["plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd0-decode"]
    run = pdctl(*args, "--mem-fraction", "0.85", "--graph-max-bs", "32")
    assert run.exit_code == 2
    assert "oom-at-graph-capture" in run.stdout
    assert pdctl(*args, "--mem-fraction", "0.70", "--graph-max-bs", "32").exit_code == 0


def test_plan_json(pdctl: Pdctl) -> None:
    run = pdctl("plan", "--format", "json", "-i", str(ROOT / "inventory.ini"), "--gpu-memory-mib",
                "49152", "--weights-gib", "20", "--kv-bytes-per-token", "8000")  # fmt: skip
    out = json.loads(run.stdout)
    decode = next(i for i in out["instances"] if i["id"] == "gpu-node-1/pd0-decode")
    assert decode["gpu"]["gpu_gib"] == 48 and decode["gpu"]["weights_gib"] == 20
    assert decode["budget"]["verdict"] == "oom-at-graph-capture" and run.exit_code == 2
    assert decode["max_safe_fraction"] is None and decode["max_safe_graph_bs"] == 35


def test_plan_unset_fraction(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    profile = shipped("reference")
    del profile["engine"]["common"]["mem_fraction_static"]
    run = pdctl("plan", "-i", str(write_deployment(profile)), "--instance", "pd0-decode")
    assert run.exit_code == 0
    assert "mem_fraction_static unset" in run.stdout and "0.6" in run.stdout


def test_unknown_instance(pdctl: Pdctl) -> None:
    run = pdctl("plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd9-decode")
    assert run.exit_code == 2 and "unknown instance pd9-decode" in run.stderr


def test_help_teaches_exit_codes() -> None:
    from click.testing import CliRunner

    from pdctl.cli import cli

    for command in ("validate", "plan"):
        out = CliRunner().invoke(cli, [command, "--help"]).output
        assert "Exit codes" in out and "Examples" in out


def _reference_text() -> str:
    return (ROOT / "deploy/profiles/reference.yml").read_text()


BAD_PROFILES = {
    "malformed YAML": (
        lambda: _reference_text().replace("  policy: round_robin", "  policy: [round_robin"),
        "malformed YAML",
    ),
    "unknown key": (
        lambda: _reference_text().replace("  context_length: 8192", "  context_lenght: 8192"),
        "engine.common.context_lenght: unknown key",
    ),
    "missing key": (
        lambda: _reference_text().replace("  kv_bytes_per_token: 15900\n", ""),
        "model.kv_bytes_per_token: required key is missing",
    ),
    "wrong type": (
        lambda: _reference_text().replace("max_running_requests: 96", "max_running_requests: lots"),
        "engine.decode.max_running_requests: input should be a valid integer",
    ),
    "duplicate pair name": (
        lambda: yaml.safe_dump(
            _pairs(yaml.safe_load(_reference_text()), ["pd0", "pd0"]), sort_keys=False
        ),
        "layout.pairs: value error, duplicate pair name 'pd0'",
    ),
    "duplicate YAML key": (
        lambda: _reference_text().replace("  port: 8000\n", "  port: 8000\n  port: 8001\n"),
        "duplicate key 'port'",
    ),
}


def _pairs(profile: dict[str, Any], names: list[str]) -> dict[str, Any]:
    pair = profile["layout"]["pairs"][0]
    profile["layout"]["pairs"] = [{**pair, "name": n} for n in names]
    return profile


@pytest.mark.parametrize("case", BAD_PROFILES, ids=str)
def test_bad_profile(case: str, pdctl: Pdctl, write_deployment: Write) -> None:
    make, expected = BAD_PROFILES[case]
    inventory = write_deployment(make())
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), expected)


def _assert_one_error(run: Any, file: str, expected: str) -> None:
    assert run.exit_code == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"Error: {file}: ")
    assert expected in lines[0]


def test_empty_inventory_group(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(shipped("reference"))
    inventory.write_text(inventory.read_text().replace("[router]\ngpu-node-1", "[router]"))
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory), "[router]: group has no hosts")


def test_profile_host_missing_from_inventory(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    profile = shipped("reference")
    profile["hosts"] = {"gpu-node-9": {"hardware": profile["hardware"]}}
    inventory = write_deployment(profile)
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(
        run, str(inventory.parent / "profile.yml"), "hosts.gpu-node-9: host is not in the inventory"
    )


def test_missing_inventory(pdctl: Pdctl, tmp_path: Path) -> None:
    run = pdctl("validate", "-i", str(tmp_path / "nope.ini"))
    _assert_one_error(run, str(tmp_path / "nope.ini"), "inventory not found")
