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
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
NUMBERS = {"five": 5}  # the spelled-out counts README uses


def _count(noun: str) -> int:
    (n,) = re.findall(rf"\b(\d+|{'|'.join(NUMBERS)}) {noun}\b", README)
    return int(NUMBERS.get(n, n))


def test_readme_counts_the_lint_rules_registered() -> None:
    assert _count("rules") == len(RULES)


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


def test_the_ops_commands_docstring_names_every_command() -> None:
    doc = ops_commands.__doc__ or ""
    names = []
    for value in vars(ops_commands).values():
        if isinstance(value, click.Group) and value.name:
            names += [f"{value.name} {sub}" for sub in value.commands]
        elif isinstance(value, click.Command) and value.name:
            names.append(value.name)
    assert {"status", "restart", "gateway register"} <= set(names)
    for name in names:
        assert re.search(rf"\b{name}\b", doc), f"{name} missing from: {doc}"
