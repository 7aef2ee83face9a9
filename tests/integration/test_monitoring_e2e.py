"""monitoring.yml on the systemd test host (docs/testhost.md), after site.yml: the roles
converge, a second run changes nothing, Prometheus scrapes every target with up == 1, the
Grafana provisioning is written and checked (Grafana itself cannot be installed there), and
rules that do not validate never replace the live ones."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.e2e.conftest import TestHost, start_testhost
from tests.e2e.fixtures_site import SIM_PROFILE, Run, build_wheelhouse

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NAME = "pdmon-e2e"
# Debian's Prometheus and node exporter baked into the host's root: it has no mirror access.
EXTRA_PACKAGES = (ROOT / "deploy/testhost/monitoring-packages").read_text().strip()
LIVE_RULES = "/etc/prometheus/rules/pdstack.rules.yml"


@pytest.fixture(scope="module")
def host() -> Iterator[TestHost]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDSTACK_TESTHOST_EXTRA_PACKAGES", EXTRA_PACKAGES)
        testhost = start_testhost(NAME)
    try:
        yield testhost
    finally:
        if os.environ.get("PDSTACK_TESTHOST_KEEP") != "1":
            testhost.down()


@pytest.fixture(scope="module")
def wheelhouse(host: TestHost) -> Path:
    return build_wheelhouse(SIM_PROFILE, host.inventory)


def play(host: TestHost, playbook: str, wheelhouse: Path, *extra: str) -> Run:
    start = time.monotonic()
    result = host.ansible_playbook(
        playbook,
        "-e", f"pdstack_profile={SIM_PROFILE}",
        "-e", f"pdstack_wheelhouse={wheelhouse}",
        "-e", "pdstack_gateway_api_key=e2e-monitoring",
        "-e", json.dumps({
            "pdstack_grafana_install": False,
            "pdstack_grafana_admin_password": "e2e-grafana-secret",
            "pdstack_prometheus_listen_address": "0.0.0.0:9090",
            "pdstack_prometheus_scrape_interval": "2s",
            "pdstack_prometheus_scrape_timeout": "2s",
        }),
        *extra,
    )  # fmt: skip
    return Run(result, time.monotonic() - start)


def targets_up(url: str) -> dict[str, str]:
    # host!="": the targets of our file_sd files, not those of the package's first config.
    query = 'up{job=~"sglang|smg|pd-exporter|node", host!=""}'
    r = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
    return {
        f"{s['metric']['job']} {s['metric']['instance']}": s["value"][1]
        for s in r.json()["data"]["result"]
    }


def test_monitoring_converges_and_scrapes_every_target(host: TestHost, wheelhouse: Path) -> None:
    play(host, "site.yml", wheelhouse).assert_ok()
    first = play(host, "monitoring.yml", wheelhouse)
    first.assert_ok()
    second = play(host, "monitoring.yml", wheelhouse)
    second.assert_ok()
    assert second.recap["changed"] == 0, second.changed_tasks()

    url = host.url(9090)
    deadline = time.monotonic() + 90
    up: dict[str, str] = {}
    while time.monotonic() < deadline:
        up = targets_up(url)
        if len(up) == 5 and set(up.values()) == {"1"}:
            break
        time.sleep(2)
    assert len(up) == 5 and set(up.values()) == {"1"}, up

    checks = host.ssh(
        "stat -c '%a %U' /etc/grafana/pdstack.env"
        " && ls /var/lib/grafana/dashboards/pdstack"
        " && grep -q 'editable: false' /etc/grafana/provisioning/datasources/pdstack.yml"
        " && grep -q 'allowUiUpdates: false' /etc/grafana/provisioning/dashboards/pdstack.yml"
        " && systemctl show -p User --value pd-exporter"
    )
    assert checks.returncode == 0, checks.stdout + checks.stderr
    lines = checks.stdout.split()
    assert lines[:2] == ["600", "root"]
    assert len([n for n in lines if n.endswith(".json")]) == 5
    assert lines[-1] == "pdstack-exporter"


def test_rules_that_do_not_validate_never_go_live(host: TestHost, wheelhouse: Path) -> None:
    before = host.ssh(f"sha256sum {LIVE_RULES}").stdout
    broken = play(
        host,
        "monitoring.yml",
        wheelhouse,
        "-e",
        json.dumps({"pdstack_prometheus_alert_thresholds": {"kv_usage_ratio": "(("}}),
    )
    assert broken.result.returncode != 0
    assert "promtool check rules" in broken.output or "failed to validate" in broken.output
    assert host.ssh(f"sha256sum {LIVE_RULES}").stdout == before
    assert host.ssh("systemctl is-active prometheus").stdout.strip() == "active"
