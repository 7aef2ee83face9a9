"""site.yml over a fleet: two test hosts on one bridge, one inventory, deploy/profiles/
sim-fleet.yml (two pairs per host on two pretend NUMA nodes, a gateway on both hosts).

In file order: the first converge, the second run (nothing changes on any host), requests
through the first host's gateway served by every pair of both hosts, and `pdctl status` of the
whole fleet from the controller.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests
from fixtures_site import API_KEY, ROOT, Site, build_wheelhouse, wait_ready

if TYPE_CHECKING:
    from conftest import TestFleet

pytestmark = pytest.mark.e2e

FLEET_PROFILE = ROOT / "deploy" / "profiles" / "sim-fleet.yml"
PAIRS_PER_HOST = 2
REQUESTS_PER_PAIR = 2
PROBES = ("/metrics", "/health", "/health_generate")


@pytest.fixture(scope="module")
def fleet_site(fleet: TestFleet) -> Iterator[Site]:
    print(f"fleet-up: {fleet.seconds:.0f}s")
    yield Site(fleet, build_wheelhouse(FLEET_PROFILE, fleet.inventory), FLEET_PROFILE)


def _served(url: str) -> float:
    """Requests an engine served, probes and scrapes apart (the fleet's inventory lets the
    controller through the engine firewall)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r'sglang:http_requests_total\{endpoint="([^"]+)"[^}]*\} (\S+)', line)
        if m and m.group(1) not in PROBES:
            total += float(m.group(2))
    return total


def test_fleet_converges(fleet_site: Site, fleet: TestFleet) -> None:
    run = fleet_site.run()
    run.assert_ok()
    assert sorted(run.recaps) == sorted(h.name for h in fleet.hosts)
    assert all(r["changed"] > 0 for r in run.recaps.values()), run.recaps
    print(f"converge: {run.seconds:.0f}s")


def test_second_run_changes_nothing_on_any_host(fleet_site: Site) -> None:
    run = fleet_site.run()
    run.assert_ok()
    changed = {h: r["changed"] for h, r in run.recaps.items()}
    assert set(changed.values()) == {0}, f"{changed}: {run.changed_tasks()}"
    print(f"second run: {run.seconds:.0f}s")


def test_first_gateway_routes_to_every_pair_on_both_hosts(fleet_site: Site) -> None:
    dep = fleet_site.deployment()
    first = dep["gateway"]["url"]
    wait_ready(first)
    instances = [i["inst"] for h in dep["hosts"].values() for i in h["instances"]]
    assert len({i["id"].split("/")[0] for i in instances}) == 2
    assert len(instances) == 2 * PAIRS_PER_HOST * 2
    before = {i["url"]: _served(i["url"]) for i in instances}
    n_pairs = len(instances) // 2
    for n in range(n_pairs * REQUESTS_PER_PAIR):
        r = requests.post(
            f"{first}/v1/chat/completions",
            json={
                "model": "sim-model",
                "messages": [{"role": "user", "content": f"request {n}"}],
                "max_tokens": 8,
            },
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
    served = {i["id"]: _served(i["url"]) - before[i["url"]] for i in instances}
    # Round robin over equal counts: every prefill and every decode of both hosts served.
    assert all(v >= 1 for v in served.values()), served


def test_pdctl_status_from_the_controller_shows_the_fleet(
    fleet_site: Site, fleet: TestFleet
) -> None:
    env = dict(
        os.environ,
        PDCTL_SSH_CONFIG=str(fleet.ssh_config),
        PDSTACK_GATEWAY_API_KEY=API_KEY,
        PYTHONPATH=str(ROOT),
    )
    pdctl = [str(Path(ROOT / ".venv" / "bin" / "pdctl")), "status"]
    args = ["-i", str(fleet.inventory), "-p", str(FLEET_PROFILE)]
    result = subprocess.run(
        [*pdctl, *args, "--format", "json"], env=env, text=True, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    status = json.loads(result.stdout)
    hosts = {h.name for h in fleet.hosts}
    assert {i["id"].split("/")[0] for i in status["instances"]} == hosts
    assert all(i["active"] == "active" and not i["unit_error"] for i in status["instances"])
    assert len(status["pairs"]) == PAIRS_PER_HOST * len(hosts)
    assert all(p["canary"]["ok"] and p["gateway"] == "routed" for p in status["pairs"])
    assert [g["ready"] for g in status["gateways"]] == [True, True]
    # The terminal view names every host (unit states come over ssh -F).
    table = subprocess.run(
        [*pdctl, *args], env={**env, "COLUMNS": "80"}, text=True, capture_output=True, timeout=120
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert "2 gateways" in table.stdout and all(h in table.stdout for h in hosts), table.stdout
