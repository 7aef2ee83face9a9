"""The pack built for someone else's Prometheus: `python -m monitoring.build --config --out`
with other job selectors, runbook address, rule window and datasource leaves none of the
defaults behind, still passes promtool, and the promtool tests still cover every alert once
their series carry the other job names."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring import build
from monitoring.build import DASHBOARDS_DIR
from monitoring.config import DEFAULT, SELECTORS
from monitoring.rules import RULES_FILE
from tests.conftest import ROOT, require_tool

# Every default job renamed (as a user's own Prometheus might name them).
JOBS = {
    "sglang": "llm-engines",
    "smg": "llm-router",
    "pd-exporter": "gpu-exporter",
    "node": "node-exporter",
    "etcd": "coord",
}
RUNBOOK = "https://wiki.example.org/llm/pdstack-runbook"
CUSTOM = {
    "selectors": {
        name: f'job="{JOBS[getattr(DEFAULT.selectors, name).split(chr(34))[1]]}"'
        for name in SELECTORS
    },
    "runbook_url": RUNBOOK,
    "datasource": "Mimir",
}
RULE_TESTS = ROOT / "monitoring" / "tests" / "pdstack.rules.test.yml"


def _build(tmp_path: Path, config: dict[str, object]) -> Path:
    cfg, out = tmp_path / "my.yml", tmp_path / "pack"
    cfg.write_text(yaml.safe_dump(config))
    assert build.main(["--config", str(cfg), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("mixin"), CUSTOM)


def test_no_default_selector_or_runbook_remains(pack: Path) -> None:
    files = sorted(pack.rglob("*.*"))
    assert [p.relative_to(pack).as_posix() for p in files] == [
        "dashboards/pdstack-decode.json",
        "dashboards/pdstack-gateway.json",
        "dashboards/pdstack-gpus.json",
        "dashboards/pdstack-overview.json",
        "dashboards/pdstack-pipeline.json",
        "rules/pdstack.rules.yml",
    ]
    for path in files:
        text = path.read_text()
        jobs = set(re.findall(r'job=~?\\?"([^"\\]*)', text))
        assert jobs and jobs <= set(JOBS.values()), (path.name, jobs - set(JOBS.values()))
        assert DEFAULT.runbook_url not in text, path.name
    # The committed default build does name the defaults: the check above can see them.
    committed = [RULES_FILE, *DASHBOARDS_DIR.glob("*.json")]
    default_jobs = {j for p in committed for j in re.findall(r'job=~?\\?"([^"\\]*)', p.read_text())}
    assert default_jobs == set(JOBS)


def test_every_alert_links_the_given_runbook(pack: Path) -> None:
    groups = yaml.safe_load((pack / "rules" / "pdstack.rules.yml").read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{RUNBOOK}#{alert['alert'].lower()}"


def test_dashboards_start_on_the_given_datasource(pack: Path) -> None:
    for path in (pack / "dashboards").glob("*.json"):
        variables = {v["name"]: v for v in json.loads(path.read_text())["templating"]["list"]}
        assert variables["datasource"]["current"]["text"] == "Mimir", path.name


def test_the_promtool_tests_pass_on_the_custom_build(pack: Path, tmp_path: Path) -> None:
    """The rule tests, with every series and expected label under the user's job names and
    the user's runbook: the same alerts fire and stay silent."""
    promtool = require_tool("promtool")
    text = RULE_TESTS.read_text().replace(DEFAULT.runbook_url, RUNBOOK)
    for old, new in JOBS.items():
        text = text.replace(f'job="{old}"', f'job="{new}"')
        text = re.sub(rf"\b(job: |scrape job ){re.escape(old)}\b(?![-\w])", rf"\g<1>{new}", text)
    tests = tmp_path / "custom.test.yml"
    rules = (pack / "rules" / "pdstack.rules.yml").resolve()
    doc = yaml.safe_load(text)
    doc["rule_files"] = [str(rules)]
    tests.write_text(yaml.safe_dump(doc, sort_keys=False))
    subprocess.run([str(promtool), "check", "rules", str(rules)], check=True)
    result = subprocess.run(
        [str(promtool), "test", "rules", str(tests)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rule_window_names_the_records(tmp_path: Path) -> None:
    rules = (_build(tmp_path, {"rate_window": "2m"}) / "rules" / "pdstack.rules.yml").read_text()
    assert "[5m]" not in rules and ":rate5m" not in rules and "5 minutes" not in rules
    assert "engine:sglang_retracted_requests:rate2m" in rules
    assert "pair:sglang_time_to_first_token_seconds:p95_2m > 2.0" in rules
    assert "in 2 minutes" in rules


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"selector": {}}, "unknown key selector (known: selectors,"),
        ({"thresholds": {"ttft": 1}}, "unknown key thresholds.ttft (known: ttft_p95_seconds,"),
        ({"runbook_url": "docs/runbook.md"}, "runbook_url must be an absolute http(s) address"),
        ({"selectors": {"engines": ""}}, "selectors.engines is empty"),
        ({"rate_window": "five"}, "rate_window must be a duration such as 5m"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object], message: str
) -> None:
    cfg = tmp_path / "bad.yml"
    cfg.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_:
        build.main(["--config", str(cfg), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error
    assert not (tmp_path / "out").exists()


def test_a_config_needs_an_out_directory(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build.main(["--config", "my.yml"])
    assert "--config needs --out" in capsys.readouterr().err
