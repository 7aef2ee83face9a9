"""What README and docs state that code can state too is checked against the code: counts of
rules, alerts and dashboards, the doctor table, the ops commands' docstring."""

from __future__ import annotations

import ast
import re

import click
import yaml

from monitoring.dashboards.export import render_dashboards
from monitoring.rules import render_rules
from pdctl.cli import ops_commands
from pdctl.lint import RULES
from pdctl.ops.context import Ops
from pdctl.pdclient import CANARIES_DOCTOR, CANARIES_STATUS, CANARIES_VERIFY
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
NUMBERS = {"five": 5}  # the spelled-out counts README uses


def _count(noun: str) -> int:
    (n,) = re.findall(rf"\b(\d+|{'|'.join(NUMBERS)}) {noun}\b", README)
    return int(NUMBERS.get(n, n))


def test_readme_counts_the_lint_rules_registered() -> None:
    assert _count("rules") == len(RULES)


def test_the_validate_table_lists_the_rules_registered_and_no_other() -> None:
    docs = (ROOT / "docs" / "spec.md").read_text()
    section = docs.split("## `pdctl validate`", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `([\w-]+)` \| (\w+) \|", section, re.M))
    assert table == {r.id: str(r.severity) for r in RULES}


def test_readme_counts_the_alerts_and_dashboards_built() -> None:
    groups = yaml.safe_load(render_rules())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert _count("alerts") == len(alerts)
    assert _count("dashboards") == len(render_dashboards())


def _doctor_checks() -> dict[str, str]:
    """{id: severity} of every finding pdctl/ops/doctor.py makes (its _error/_warning calls)."""
    tree = ast.parse((ROOT / "pdctl" / "ops" / "doctor.py").read_text())
    severity = {"_error": "error", "_warning": "warning"}
    checks = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in severity:
                (first, *_) = node.args
                assert isinstance(first, ast.Constant), ast.unparse(node)
                checks[first.value] = severity[node.func.id]
            if node.func.id == "Finding":  # only inside those two, with their `id`
                assert not isinstance(node.args[0], ast.Constant), ast.unparse(node)
    return checks


def test_the_doctor_table_lists_every_check_doctor_makes() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    section = docs.split("## `pdctl doctor`", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `(live-[\w-]+)` \| (\w+) \|", section, re.M))
    checks = _doctor_checks()
    assert len(checks) >= 13
    assert table == checks


def _ops_commands() -> list[str]:
    """Every command pdctl/cli/ops_commands.py defines, a group's as `group sub`."""
    values = vars(ops_commands).values()
    groups = [v for v in values if isinstance(v, click.Group)]
    grouped = [c for g in groups for c in g.commands.values()]
    names = [f"{g.name} {sub}" for g in groups for sub in g.commands]
    names += [v.name for v in values if isinstance(v, click.Command) and v not in groups + grouped]
    assert {"status", "restart", "gateway register", "gateway heartbeat"} <= set(names)
    return names


def test_the_ops_commands_docstring_names_every_command() -> None:
    doc = ops_commands.__doc__ or ""
    for name in _ops_commands():
        assert re.search(rf"\b{name}\b", doc), f"{name} missing from: {doc}"


def test_the_operations_table_lists_every_ops_command() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    table = docs.split("\n## ", 1)[0]
    for name in _ops_commands():
        assert f"| `pdctl {name}" in table, f"pdctl {name} missing from docs/operations.md's table"


def test_the_canary_counts_documented_are_the_defaults() -> None:
    """One default per purpose (pdclient.CANARIES_*), said once in docs/operations.md."""
    docs = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    said = (
        f"status sends {CANARIES_STATUS} by default, doctor {CANARIES_DOCTOR}, restart 1 "
        f"then {CANARIES_VERIFY} more"
    )
    assert said in docs
    assert Ops.__dataclass_fields__["verify_canaries"].default == CANARIES_VERIFY
    defaults = {c.name: c.params for c in (ops_commands.status, ops_commands.doctor)}
    assert [p.default for p in defaults["status"] if p.name == "canaries"] == [CANARIES_STATUS]
    assert [p.default for p in defaults["doctor"] if p.name == "canaries"] == [CANARIES_DOCTOR]
