"""Alert and recording rules: generated file up to date, promtool-valid, unit-tested, and
every alert shaped the way operators rely on (severity, summary, templated description, a
runbook section that exists)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.config import DEFAULT, load
from monitoring.rules import RULES_FILE, render_rules
from tests.conftest import ROOT, require_tool
from tests.promql import metric_names, name_regexes

RUNBOOK = ROOT / "docs" / "runbook.md"
RULE_TESTS = sorted((ROOT / "monitoring" / "tests").glob("*.yml"))
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def runbook_anchors() -> set[str]:
    """Anchors of the alert sections; the `Procedure: …` sections serve several alerts."""
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    return {h.strip().lower().replace(" ", "-") for h in headings if not h.startswith("Procedure")}


def test_committed_rules_are_the_default_build() -> None:
    assert RULES_FILE.read_text() == render_rules(), "run python -m monitoring.build"


def test_promtool_checks_the_rules() -> None:
    promtool = require_tool("promtool")
    subprocess.run([str(promtool), "check", "rules", str(RULES_FILE)], check=True)


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass(test_file: Path) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [str(promtool), "test", "rules", str(test_file)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing() -> None:
    tested = set()
    for test_file in RULE_TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    tested.add(check["alertname"])
    assert {a["alert"] for a in alerts()} <= tested


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_shape(alert: dict[str, Any]) -> None:
    assert "for" in alert
    assert alert["labels"]["severity"] in {"critical", "warning"}
    notes = alert["annotations"]
    assert "{{" not in notes["summary"], "summary stays static so alerts group"
    assert "{{ $labels." in notes["description"]
    page, _, anchor = notes["runbook_url"].partition("#")
    assert page == DEFAULT.runbook_url and page.startswith("https://")
    assert anchor == alert["alert"].lower()
    assert anchor in runbook_anchors()


def test_runbook_has_a_section_per_alert_and_no_orphans() -> None:
    assert runbook_anchors() == {a["alert"].lower() for a in alerts()}


def test_recording_rule_names_follow_level_metric_operations() -> None:
    records = [r["record"] for r in rules() if "record" in r]
    assert records
    for name in records:
        assert RECORD_NAME.match(name), name


def test_thresholds_are_variables() -> None:
    text = render_rules(
        load({"thresholds": {"ttft_p95_seconds": 7.5}, "runbook_url": "https://example.org/rb"})
    )
    assert "pair:sglang_time_to_first_token_seconds:p95_5m > 7.5" in text
    assert "https://example.org/rb#pdenginedown" in text


def test_rule_engine_metric_names_exist_in_the_pinned_sglang() -> None:
    from tests.unit.test_dashboards import sglang_series_names

    used = {n for r in rules() for n in metric_names(r["expr"]) if n.startswith("sglang:")}
    regex_selected = {
        n
        for r in rules()
        for rx in name_regexes(r["expr"])
        for n in sglang_series_names()
        if re.fullmatch(rx, n)
    }
    assert used - sglang_series_names() == set()
    assert len(regex_selected) == 6, "the six queue gauges of engine:sglang_pending_reqs:sum"
