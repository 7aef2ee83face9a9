"""The "restart pending" marker: read and removed on the pair's host, shown by status, cleared
by the coordinated restart."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pdctl import names
from pdctl.cli import status_view
from pdctl.ops import pending, restart, status, systemd
from pdctl.ops.gateway import GatewayWorker
from pdctl.pdclient import CanaryResult
from tests.unit.ops_fakes import FakeCanaries, FakeGateway, FakeSystemd, Listing, fake_ops, topo

MARKER = '{"reason": "/etc/pdstack/pd1-decode.env changed", "since": "2026-11-30T21:00:00Z"}\n'
PD1 = names.restart_pending("pd1")


def test_marker_path_is_owned_by_names() -> None:
    assert PD1 == "/var/lib/pdstack-pending/pd1.json"
    assert PD1 in names.pair_files("pd1")  # removed with a pair that leaves the profile


def test_marker_reads_and_describes() -> None:
    sd = FakeSystemd()
    pair = fake_ops(sd, FakeGateway()).source.pairs()[1]
    assert pending.read(sd, pair) is None
    sd.files[PD1] = MARKER
    got = pending.read(sd, pair)
    assert got == pending.Pending(
        reason="/etc/pdstack/pd1-decode.env changed", since="2026-11-30T21:00:00Z"
    )
    assert pending.describe(got) == (
        "restart pending: /etc/pdstack/pd1-decode.env changed (since 2026-11-30T21:00:00Z)"
    )
    assert pending.describe(None) is None
    pending.clear(sd, pair)
    assert PD1 not in sd.files


@pytest.mark.parametrize(
    ("text", "why"),
    [("not json", "top level: Invalid JSON"), ('{"since": "x"}', "reason: Field required")],
)
def test_an_unreadable_marker_still_means_pending(text: str, why: str) -> None:
    got = pending.parse(text)
    assert got.reason.startswith(f"(unreadable marker: {why}")


def _canaries(ok: bool) -> FakeCanaries:
    err = None if ok else "decode answered HTTP 500"
    return FakeCanaries(lambda _n: CanaryResult(ok, 1, 0 if ok else 1, 0.01, err))


def test_a_successful_restart_clears_the_marker() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    sd.files[PD1] = MARKER
    ops = fake_ops(sd, gw, canaries=_canaries(True))
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[1:])
    assert rep.ok and PD1 not in sd.files


def test_a_failed_restart_keeps_the_marker() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    sd.files[PD1] = MARKER
    ops = fake_ops(sd, gw, canaries=_canaries(False))
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[1:])
    assert not rep.ok and sd.files[PD1] == MARKER  # not yet on the new files


def test_status_shows_pending_in_table_and_json() -> None:
    gw = Listing(
        held=[GatewayWorker(i.url, i.url, "?", "ready", True, 0) for i in topo().instances]
    )
    sd = FakeSystemd()
    sd.files[PD1] = MARKER
    s = status.collect(fake_ops(sd, gw), 1)
    assert s.healthy  # pending is news, not a fault: the pair serves on its old files
    pairs = status_view.to_json(s)["pairs"]
    assert [p["restart_pending"] for p in pairs] == [
        None,
        "restart pending: /etc/pdstack/pd1-decode.env changed (since 2026-11-30T21:00:00Z)",
    ]
    console = Console(width=80, record=True)
    console.print(status_view.view(s))
    text = console.export_text()
    assert "restart pending: /etc/pdstack/pd1-decode.env changed" in text
    assert text.count("restart pending") == 1


def test_status_says_when_the_marker_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    class Unreachable(FakeSystemd):
        def read_file(self, path: str) -> str | None:
            raise systemd.HostError("node-a: unreachable: `sh -c ...`: No route to host")

    got = pending.safe_read(Unreachable(), fake_ops(FakeSystemd(), FakeGateway()).source.pairs()[0])
    assert pending.describe(*got) == (
        "restart pending: unknown (node-a: unreachable: `sh -c ...`: No route to host)"
    )


def _ssh_as_local_shell(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """ssh HOST CMDLINE: run CMDLINE in a local shell, as sshd would on the host."""
    assert argv[: len(systemd.SSH)] == systemd.SSH
    return subprocess.run(["sh", "-c", argv[-1]], **kw)


def test_remote_read_and_remove_of_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_run = subprocess.run
    monkeypatch.setattr(
        subprocess, "run", lambda argv, **kw: _ssh_as_local_shell(argv, **kw) if argv[0] == "ssh"
        else real_run(argv, **kw)
    )  # fmt: skip
    sd = systemd.Systemctl("node-b", "root@10.0.1.1")
    f = tmp_path / "pd0 it's.json"  # quoting survives the remote shell
    assert sd.read_file(str(f)) is None
    f.write_text("first\nsecond\n")
    assert sd.read_file(str(f)) == "first\nsecond\n"
    sd.remove_file(str(f))
    assert not f.exists()
    sd.remove_file(str(f))  # absent: nothing to do
    f.mkdir()
    with pytest.raises(systemd.HostError, match=r"node-b: failed: .*Is a directory"):
        sd.read_file(str(f))


def test_local_read_and_remove_of_a_file(tmp_path: Path) -> None:
    sd = systemd.Systemctl("here")
    f = tmp_path / "m.json"
    assert sd.read_file(str(f)) is None
    f.write_text(MARKER)
    assert sd.read_file(str(f)) == MARKER
    sd.remove_file(str(f))
    sd.remove_file(str(f))
    assert not f.exists()
