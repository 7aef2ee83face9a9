"""The roles pass ansible-lint (production profile) and yamllint, and every default is
documented in meta/argument_specs.yml (and every documented option has a default or is
required)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
BIN = ROOT / ".venv" / "bin"


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        pytest.skip(f"{exe} not found; run scripts/setup.sh")
    return subprocess.run(
        [str(exe), *args], cwd=ROOT, text=True, capture_output=True, timeout=600, check=False
    )


def test_ansible_lint_production_profile() -> None:
    result = _run("ansible-lint", "--nocolor")
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint() -> None:
    result = _run("yamllint", "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_site_syntax() -> None:
    result = _run("ansible-playbook", "--syntax-check", "site.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_defaults_match_argument_specs(role: Path) -> None:
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(defaults) - set(options) == set(), "defaults missing from argument_specs"
    undocumented = {k for k, o in options.items() if k not in defaults and not o.get("required")}
    assert undocumented == set(), "options neither defaulted nor required"
    for name, value in defaults.items():
        assert name.startswith(f"{role.name}_") or role.name == "pdstack", name
        assert options[name].get("default") == value, f"{name}: spec default differs"
        assert options[name].get("description"), f"{name}: no description"
