"""roles/pdstack and the roles that import it: only missing environments are built (and only
then is the wheelhouse copied), each role's units are filled in with the environments built
this run and switched in place first when only the path changes, and prune runs with the kept
count the inventory sets. Expressions are evaluated by real Ansible on localhost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdctl import names
from tests.conftest import ROOT, role_expression

ROLES = ROOT / "roles"
ENVS = {
    "engine": {"name": "sglang-0.5.23-aaaaaaaaaaaa", "wheels": ["pdctl-0.1.0-py3-none-any.whl"]},
    "gateway": {"name": "smg-1.13.0-bbbbbbbbbbbb", "wheels": ["smg-1.13.0-cp38-abi3.whl"]},
    "pdctl": {"name": "pdctl-0.1.0-cccccccccccc", "wheels": ["pdctl-0.1.0-py3-none-any.whl"]},
}
BUILT = {k: {**v, "path": f"{names.ENVS_DIR}/{v['name']}"} for k, v in ENVS.items()}


def _tasks(role: str, file: str) -> list[dict[str, Any]]:
    return yaml.safe_load((ROLES / role / "tasks" / file).read_text())


def _task(role: str, file: str, name: str) -> dict[str, Any]:
    (t,) = [t for t in _tasks(role, file) if t["name"] == name]
    return t


def test_only_missing_environments_are_built_and_prune_keeps_the_inventorys_count(
    tmp_path: Path,
) -> None:
    facts = {
        "__pdstack_env_stat": {
            "results": [
                {"item": "engine", "stat": {"exists": False}},
                {"item": "pdctl", "stat": {"exists": True}},
            ]
        },
        "__pdstack_deployment": {"layout": _layout()},
        "pdstack_python": "/usr/bin/python3",
        "pdstack_envs_keep": 3,
    }
    got = role_expression(
        tmp_path,
        ROLES / "pdstack" / "vars" / "main.yml",
        facts,
        "{'missing': _pdstack_envs_missing, 'prune': _pdstack_envs_prune}",
    )
    assert got["missing"] == ["engine"]
    assert got["prune"] == [
        "/usr/bin/python3", names.ENV_TOOL, "prune",
        "--envs-dir", names.ENVS_DIR, "--legacy", names.LEGACY_VENV, "--keep", "3",
        "--unit-dir", names.UNIT_DIR, "--link", names.PDCTL_LINK,
    ]  # fmt: skip
    # The wheelhouse is looked for (and copied) only when something is missing.
    look = _task("pdstack", "install.yml", "Look for the wheelhouse on the host")
    assert look["when"] == "_pdstack_envs_missing | length > 0"
    build = _task("pdstack", "install.yml", "Build the missing environments")
    assert build["loop"] == "{{ _pdstack_envs_missing }}"
    argv = build["ansible.builtin.command"]["argv"]
    assert argv[2] == "build" and argv[-1] == "{{ __pdstack_envs[item].wheels | to_json }}"
    defaults = yaml.safe_load((ROLES / "pdstack" / "defaults" / "main.yml").read_text())
    assert defaults["pdstack_envs_keep"] == 2


def _layout() -> dict[str, str]:
    return {
        "envs_dir": names.ENVS_DIR,
        "legacy_venv": names.LEGACY_VENV,
        "env_tool": names.ENV_TOOL,
        "unit_dir": names.UNIT_DIR,
        "pdctl_link": names.PDCTL_LINK,
    }


def test_engine_units_run_from_the_engine_environment_and_switch_before_the_write(
    tmp_path: Path,
) -> None:
    write = _task("pdstack_engine", "configure.yml", "Write the engine units")
    facts = {
        "__pdstack_envs": BUILT,
        "item": {"command_lines": [f"{names.env_slot('engine')}/bin/python -m pdctl.sim"]},
    }
    lines = role_expression(
        tmp_path,
        ROLES / "pdstack_engine" / "vars" / "main.yml",
        facts,
        write["vars"]["command_lines"].strip("{} "),
    )
    assert lines == [f"{BUILT['engine']['path']}/bin/python -m pdctl.sim"]
    names_ = [t["name"] for t in _tasks("pdstack_engine", "configure.yml")]
    switch = "Switch engine units to an environment of the same content"
    assert names_.index(switch) == names_.index("Write the engine units") - 1
    argv = _task("pdstack_engine", "configure.yml", switch)["ansible.builtin.command"]["argv"]
    assert "'python=' ~ _pdstack_engine_envs.engine" in argv


def test_gateway_units_fill_in_smg_and_pdctl_environments(tmp_path: Path) -> None:
    write = _task("pdstack_gateway", "configure.yml", "Write the gateway unit")
    slot = f"{names.env_slot('pdctl')}/bin/pdctl gateway register --gateway h1"
    facts = {
        "__pdstack_envs": BUILT,
        "__pdstack_deployment": {
            "gateway": {"register": {"localhost": slot}, "lease": {}},
            "layout": {},
        },
    }
    got = role_expression(
        tmp_path,
        ROLES / "pdstack_gateway" / "vars" / "main.yml",
        facts,
        write["vars"]["register_command"].strip("{}> \n"),
    )
    assert got == f"{BUILT['pdctl']['path']}/bin/pdctl gateway register --gateway h1"
    switch = _task(
        "pdstack_gateway",
        "configure.yml",
        "Switch the gateway units to environments of the same content",
    )
    argv = switch["ansible.builtin.command"]["argv"]
    assert "'smg=' ~ _pdstack_gateway_envs.gateway" in argv
    assert "'pdctl=' ~ _pdstack_gateway_envs.pdctl" in argv
    assert switch["notify"] == "Reload systemd"
