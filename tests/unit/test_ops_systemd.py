"""pdctl.ops.systemd: `systemctl show` parsing, ssh to other hosts, local runs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdctl.ops import systemd

SHOW = """LoadState=loaded
ActiveState=active
SubState=running
MainPID=4242
ActiveEnterTimestamp=@1764400000
NRestarts=2
ExecStart={ path=/usr/bin/numactl ; argv[]=/usr/bin/numactl --cpunodebind=0 \
/opt/pdstack/venv/bin/python -m pdctl.sim --port 30001 ; ignore_errors=no ; pid=0 }
"""  # the backslash joins the ExecStart line


def test_parse_show() -> None:
    st = systemd.parse_show("u.service", SHOW)
    assert (st.active, st.sub, st.main_pid, st.since, st.restarts) == (
        "active",
        "running",
        4242,
        1764400000.0,
        2,
    )
    assert st.exec_start[-4:] == ["-m", "pdctl.sim", "--port", "30001"]
    stopped = systemd.parse_show(
        "u.service", "ActiveState=inactive\nMainPID=0\nActiveEnterTimestamp=\n"
    )
    assert (stopped.active, stopped.main_pid, stopped.since) == ("inactive", 0, None)


@dataclass
class FakeRun:
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    argv: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, self.returncode, self.stdout, self.stderr)


def test_remote_systemctl_goes_through_ssh_and_names_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(stdout=SHOW)
    monkeypatch.setattr(subprocess, "run", fake)
    sd = systemd.Systemctl("node-b", "root@10.0.1.1")
    assert sd.show("pdstack-pd0-decode.service").main_pid == 4242
    sd.stop("pdstack-pd0.target")
    assert fake.argv[0][:-1] == [*systemd.SSH, "root@10.0.1.1"]
    assert fake.argv[1][-1] == "systemctl stop pdstack-pd0.target"
    fake.returncode, fake.stderr = 255, "ssh: connect to host 10.0.1.1 port 22: No route to host"
    with pytest.raises(systemd.HostError, match=r"node-b: unreachable: .*No route to host"):
        sd.show("x.service")


def test_remote_host_ssh_user_and_config_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(stdout=SHOW)
    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setenv("PDCTL_SSH_USER", "ops")
    monkeypatch.setenv("PDCTL_SSH_CONFIG", "/srv/fleet/ssh_config")
    systemd.for_host("node-b", "192.0.2.7").show("pdstack-pd0-decode.service")
    assert fake.argv[0][:-1] == [*systemd.SSH, "-F", "/srv/fleet/ssh_config", "ops@192.0.2.7"]


def test_local_systemctl_runs_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun(stdout="line 1\nline 2\n")
    monkeypatch.setattr(subprocess, "run", fake)
    sd = systemd.Systemctl("here")
    assert sd.journal("u.service", 2) == ["line 1", "line 2"]
    assert fake.argv == [["journalctl", "-u", "u.service", "-n", "2", "-o", "cat", "--no-pager"]]


def test_loopback_is_local() -> None:
    assert systemd.is_local("not-this-host", "127.0.0.1")
    assert not systemd.is_local("not-this-host", "192.0.2.1")  # TEST-NET-1, never ours
