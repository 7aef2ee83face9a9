"""Unit-test helpers: profiles as dicts, written with an inventory to tmp_path and loaded."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from pdctl.cli import main
from pdctl.spec import Deployment, load_deployment

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "deploy" / "profiles"

_SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in PROFILES.glob("*.yml")}


@pytest.fixture
def shipped() -> Callable[[str], dict[str, Any]]:
    """shipped("reference") -> a fresh copy of deploy/profiles/reference.yml to modify."""
    return lambda name: copy.deepcopy(_SHIPPED[name])


def inventory_text(
    hosts: list[str], router: str | None = None, profile: str = "profile.yml"
) -> str:
    lines = ["[pd_hosts]", *hosts, "", "[router]", router or hosts[0], ""]
    return "\n".join([*lines, "[all:vars]", f"pdstack_profile={profile}", ""])


WriteDeployment = Callable[..., Path]


@pytest.fixture
def write_deployment(tmp_path: Path) -> WriteDeployment:
    """write(profile_dict_or_text, hosts=[...], router=None) -> the inventory path.

    The inventory names profile.yml next to it, so `pdctl validate -i <path>` finds both.
    """

    def write(
        profile: dict[str, Any] | str, hosts: list[str] | None = None, router: str | None = None
    ) -> Path:
        text = profile if isinstance(profile, str) else yaml.safe_dump(profile, sort_keys=False)
        (tmp_path / "profile.yml").write_text(text)
        inventory = tmp_path / "inventory.ini"
        inventory.write_text(inventory_text(hosts or ["gpu-node-1"], router))
        return inventory

    return write


@pytest.fixture
def load(write_deployment: WriteDeployment) -> Callable[..., Deployment]:
    """load(profile_dict, hosts=..., router=...) -> the resolved Deployment."""

    def _load(profile: dict[str, Any], **kw: Any) -> Deployment:
        return load_deployment(write_deployment(profile, **kw))

    return _load


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str


def _run_pdctl(*args: str) -> Run:
    runner = CliRunner()
    with runner.isolation() as (out, err, _), pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["pdctl", *args])
        mp.setenv("COLUMNS", "200")
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return Run(code, out.getvalue().decode(), err.getvalue().decode())


@pytest.fixture
def pdctl() -> Callable[..., Run]:
    """pdctl("validate", "-i", path) runs the real entry point in-process: `Error: …` on
    stderr and the exit codes a shell sees, which CliRunner.invoke on the group would not show."""
    return _run_pdctl
