"""The defences of docs/security.md on a real systemd host converged by site.yml: the engine
firewall (the gateway's key cannot be bypassed from outside the allowed hosts), the hardened
units still serving, and the gateway's key out of the engines' reach.

The controller is outside the allowed set: the inventory's router, monitoring and engine
hosts are all the test host itself.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
import requests
from fixtures_site import API_KEY, Site, site_fixture, wait_ready  # noqa: F401

if TYPE_CHECKING:
    from conftest import TestHost

pytestmark = pytest.mark.e2e

# The highest exposure (systemd-analyze security, on the host's own systemd) per unit kind;
# tests/unit/test_unit_hardening.py checks the same limits offline for every unit.
LIMITS = {"engine": 4.0, "gateway": 3.0, "recover": 5.0, "firewall": 5.0, "store": 3.0}


@pytest.fixture(scope="module")
def converged(site: Site) -> dict[str, Any]:
    site.run().assert_ok()
    dep = site.deployment()
    wait_ready(dep["gateway"]["url"])
    return dep


def _engine_ports(dep: dict[str, Any], host: TestHost) -> list[int]:
    ports: list[int] = dep["hosts"][host.name]["ports"]
    assert ports
    return ports


def _refused(url: str) -> bool:
    try:
        requests.get(url, timeout=10)
    except requests.ConnectionError:
        return True
    return False


def _from_host(host: TestHost, url: str) -> str:
    """HTTP status of a GET sent from the test host itself (an allowed source)."""
    r = host.ssh(f"curl -s -o /dev/null -m 10 -w '%{{http_code}}' {url}")
    return r.stdout.strip()


def _generate(url: str, **headers: str) -> requests.Response:
    return requests.post(
        f"{url}/generate",
        json={"text": "Say hello", "sampling_params": {"max_new_tokens": 4}},
        headers=headers,
        timeout=60,
    )


def test_engine_ports_refuse_the_outside_and_the_gateway_still_serves(
    site: Site, converged: dict[str, Any]
) -> None:
    host = site.host
    for port in _engine_ports(converged, host):
        # The bypass: straight to an engine or a bootstrap port, no key needed but refused.
        assert _refused(host.url(port, "/health")), f"port {port} answers the controller"
        assert _from_host(host, host.url(port, "/health")) != "000", f"port {port} closed to host"
    for inst in converged["hosts"][host.name]["instances"]:
        assert _from_host(host, f"{inst['inst']['url']}/health") == "200"
    # Other ports are left alone: the gateway answers the controller, and only with the key.
    gateway = converged["gateway"]["url"]
    assert _generate(gateway).status_code == 401
    r = _generate(gateway, Authorization=f"Bearer {API_KEY}")
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] > 0
    table = host.ssh("nft list table inet pdstack", check=True).stdout
    assert re.search(r"elements = \{ [^}]*" + str(_engine_ports(converged, host)[0]), table)


def test_firewall_allow_list_and_off_switch(site: Site, converged: dict[str, Any]) -> None:
    host = site.host
    port = _engine_ports(converged, host)[0]
    url = host.url(port, "/health")
    try:
        allow = json.dumps({"pdstack_engine_firewall_allow": [host.controller_address]})
        site.run("-e", allow).assert_ok()
        assert requests.get(url, timeout=10).status_code == 200
        site.run("-e", "pdstack_engine_firewall=false").assert_ok()
        tables = host.ssh("nft list tables", check=True).stdout
        # The engines' table is gone; the store's own (inet pdstack_etcd) is another role's.
        assert not re.search(r"^table inet pdstack$", tables, re.M), tables
        assert requests.get(url, timeout=10).status_code == 200
        gone = host.ssh("ls /etc/systemd/system/pdstack-firewall.service /etc/pdstack/firewall.nft")
        assert gone.stdout == "" and gone.returncode != 0
    finally:
        site.run().assert_ok()
    assert _refused(url)
    assert host.ssh("systemctl is-enabled pdstack-firewall.service").stdout.strip() == "enabled"


def _exposure(host: TestHost, unit: str) -> float:
    out = host.ssh(f"systemd-analyze security --no-pager {unit}", check=True).stdout
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert match, out[-2000:]
    return float(match.group(1))


def test_hardened_units_run_within_their_exposure(site: Site, converged: dict[str, Any]) -> None:
    host = site.host
    units = {i["inst"]["unit"]: "engine" for i in converged["hosts"][host.name]["instances"]}
    pair = converged["hosts"][host.name]["pairs"][0]["pair"]
    units |= {
        converged["gateway"]["unit"]: "gateway",
        f"pdstack-recover@{pair}.service": "recover",
        "pdstack-firewall.service": "firewall",
        "pdstack-etcd.service": "store",
    }
    scores = {unit: _exposure(host, unit) for unit in units}
    print(json.dumps(scores))
    assert all(scores[u] <= LIMITS[kind] for u, kind in units.items()), scores
    running = [u for u, kind in units.items() if kind in ("engine", "gateway", "firewall", "store")]
    active = host.ssh(f"systemctl is-active {' '.join(running)}").stdout.split()
    assert active == ["active"] * len(running)


def test_the_gateway_key_is_out_of_the_engines_reach(site: Site, converged: dict[str, Any]) -> None:
    host = site.host
    gateway_unit = converged["gateway"]["unit"]
    engine_unit = converged["hosts"][host.name]["instances"][0]["inst"]["unit"]

    def user_and_pid(unit: str) -> tuple[str, str]:
        out = host.ssh(f"systemctl show -p User -p MainPID {unit}", check=True).stdout
        props = dict(line.split("=", 1) for line in out.splitlines())
        return props["User"], props["MainPID"]

    g_user, g_pid = user_and_pid(gateway_unit)
    e_user, e_pid = user_and_pid(engine_unit)
    assert g_user != e_user, "the gateway runs as the engines' user"
    # smg takes the key only in its argv and, once started, overwrites its argv and environment
    # area with its title: the key shows in /proc for a moment at start, then only in memory.
    for shown in ("cmdline", "environ"):
        text = host.ssh(f"cat /proc/{g_pid}/{shown}", check=True).stdout
        assert API_KEY not in text, shown
    # Inside an engine (as its user, in its mount namespace) /proc hides the gateway's process
    # altogether, so no moment at start and no memory read; the env file is root's.
    as_engine = f"nsenter -t {e_pid} -m -S $(id -u {e_user}) -G $(id -g {e_user}) --"
    own = host.ssh(f"{as_engine} cat /proc/{e_pid}/cmdline")
    assert own.returncode == 0 and "--port" in own.stdout, own.stderr  # the probe works
    assert host.ssh(f"test -d /proc/{g_pid}").returncode == 0
    assert host.ssh(f"{as_engine} test -e /proc/{g_pid}").returncode != 0, "gateway visible"
    secrets = host.ssh(f"{as_engine} cat /etc/pdstack/gateway.env")
    assert secrets.returncode != 0 and API_KEY not in secrets.stdout
