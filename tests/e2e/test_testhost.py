"""The systemd test host itself: a real systemd host over SSH and Ansible, and a clean down."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # tests/ is not a package; the fixture's class lives in tests/e2e/conftest.py
    from conftest import TestHost

pytestmark = pytest.mark.e2e


def test_systemd_is_pid1(testhost: TestHost) -> None:
    result = testhost.ssh("cat /proc/1/comm", check=True)
    assert result.stdout.strip() == "systemd"


def test_system_is_running(testhost: TestHost) -> None:
    result = testhost.ssh("systemctl is-system-running")
    state = result.stdout.strip()
    failed = testhost.ssh("systemctl --failed --no-legend --plain").stdout
    assert state in ("running", "degraded"), f"state {state!r}, failed units:\n{failed}"


def test_ssh_runs_commands_as_root(testhost: TestHost) -> None:
    result = testhost.ssh("id -u; hostname; cat /etc/os-release", check=True)
    lines = result.stdout.splitlines()
    assert lines[0] == "0"
    assert lines[1] == testhost.name
    assert "VERSION_CODENAME=bookworm" in result.stdout


def test_ssh_rejects_passwords(testhost: TestHost) -> None:
    result = testhost.ssh(
        "sshd -T 2>/dev/null | grep -Ei '^(permitrootlogin|passwordauthentication) '"
    )
    settings = dict(line.split() for line in result.stdout.lower().splitlines())
    assert settings == {"permitrootlogin": "without-password", "passwordauthentication": "no"}


def test_inventory_groups(testhost: TestHost) -> None:
    text = testhost.inventory.read_text()
    for group in ("[pd_hosts]", "[router]", "[monitoring]", "[etcd]"):
        assert group in text
    result = testhost.ansible("pd_hosts:&router:&monitoring:&etcd", "--list-hosts")
    assert result.returncode == 0, result.stderr
    assert testhost.name in result.stdout


def test_ansible_ping_and_facts(testhost: TestHost) -> None:
    ping = testhost.ansible("all", "-m", "ansible.builtin.ping")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert '"pong"' in ping.stdout or "pong" in ping.stdout
    facts = testhost.ansible(
        "all", "-m", "ansible.builtin.setup", "-a", "filter=ansible_service_mgr"
    )
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "systemd" in facts.stdout.split("ansible_service_mgr", 1)[1][:40]


def test_service_reachable_from_controller(testhost: TestHost) -> None:
    # A port opened on the test host answers at its address from the controller.
    testhost.ssh(
        "systemd-run --unit=pd-e2e-http --collect -p WorkingDirectory=/etc "
        "python3 -m http.server 18080 --bind 0.0.0.0",
        check=True,
    )
    try:
        probe = [
            "python3", "-c",
            "import sys, time, urllib.request\n"
            "for _ in range(50):\n"
            "    try:\n"
            "        print(urllib.request.urlopen(sys.argv[1], timeout=2).status); break\n"
            "    except OSError:\n"
            "        time.sleep(0.2)\n",
            testhost.url(18080, "/hostname"),
        ]  # fmt: skip
        result = subprocess.run(probe, text=True, capture_output=True, timeout=60)
        assert result.stdout.strip() == "200", result.stderr
    finally:
        testhost.ssh("systemctl stop pd-e2e-http")


def test_down_leaves_nothing(testhost_factory: Callable[..., TestHost]) -> None:
    host = testhost_factory("pde2e-down")
    assert host.ssh("true").returncode == 0
    leader = host.leader_pid
    assert leader is not None and Path(f"/proc/{leader}").exists()
    host.down()
    assert not _alive(leader)
    link = subprocess.run(["ip", "link", "show", host.link], capture_output=True, text=True)
    assert link.returncode != 0, link.stdout
    assert not host.inventory.exists()
    # Idempotent.
    host.down()


def test_host_without_systemd(testhost_factory: Callable[..., TestHost]) -> None:
    # For the "missing systemd" preflight: same root, sshd only, no systemd as PID 1.
    host = testhost_factory("pde2e-nosd", init="none")
    assert host.ssh("cat /proc/1/comm", check=True).stdout.strip() != "systemd"
    assert host.ssh("test -d /run/systemd/system").returncode != 0
    facts = host.ansible("all", "-m", "ansible.builtin.setup", "-a", "filter=ansible_service_mgr")
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "ansible_service_mgr: systemd" not in facts.stdout
    assert '"ansible_service_mgr": "systemd"' not in facts.stdout


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for this machine's PID 1 to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
