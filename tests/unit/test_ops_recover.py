"""pdctl.ops.recover: the rate limit and its state file, and the units that start a
recovery."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl import names, render
from pdctl.ops.recover import RateLimit, RateLimited, RecoveryLog
from pdctl.spec import Deployment
from tests.conftest import ROOT


def test_rate_limit_window(tmp_path: Path) -> None:
    now = [1000.0]
    log = RecoveryLog(tmp_path / "state.json", clock=lambda: now[0])
    limit = RateLimit(max_count=2, window_s=100)
    log.admit("node-a/pd0", limit)
    now[0] += 10
    log.admit("node-a/pd0", limit)
    log.admit("node-a/pd1", limit)  # other pairs count separately
    with pytest.raises(RateLimited, match="2 recoveries in the last 100s"):
        log.admit("node-a/pd0", limit)
    now[0] += 95  # the first one left the window
    log.admit("node-a/pd0", limit)
    assert len(log.recent("node-a/pd0", 100)) == 2


def test_rate_limit_survives_a_corrupt_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    RecoveryLog(path).admit("p", RateLimit(1, 60))
    assert len(RecoveryLog(path).recent("p", 60)) == 1


def test_engine_units_start_the_pairs_recovery_on_failure(
    load: Callable[..., Deployment], shipped: Callable[[str], dict[str, Any]]
) -> None:
    dep = load(shipped("sim"), hosts=["node-a"])
    for inst in dep.instances:
        unit = render.render_instance(inst, dep).unit
        assert "\nOnFailure=pdstack-recover@pd0.service\n" in unit
        assert "\nRestart=no\n" in unit  # systemd never restarts one side alone
    recover_unit = (
        render.jinja_env(ROOT / "roles/pdstack_engine/templates")
        .get_template("recover@.service.j2")
        .render(
            ansible_managed=render.MANAGED,
            venv=names.VENV,
            host="node-a",
            pending_dir=names.RESTART_PENDING_DIR,
        )
    )
    assert f"\nExecStart={names.VENV}/bin/pdctl recover --pair node-a/%i\n" in recover_unit
    # ProtectSystem=strict: the recovery removes the pair's restart-pending marker there.
    assert f"\nReadWritePaths=-{names.RESTART_PENDING_DIR}\n" in recover_unit
    assert "\nType=oneshot\n" in recover_unit


def test_recovery_log_keeps_other_pairs_and_files_private(tmp_path: Path) -> None:
    warned: list[str] = []
    log = RecoveryLog(tmp_path / "s" / "state.json", clock=lambda: 100.0, warn=warned.append)
    log.admit("a", RateLimit(2, 60))
    log.admit("b", RateLimit(2, 60))
    assert stat.S_IMODE((tmp_path / "s" / "state.json").stat().st_mode) == 0o600
    assert json.loads((tmp_path / "s" / "state.json").read_text()) == {"a": [100.0], "b": [100.0]}
    assert warned == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00junk", "Invalid JSON"),
        (b'{"p": [1, "soon"]}', "p.1: "),
        (b'{"p": 3}', "p: "),
        (b"x" * (2 << 20), "larger than"),
    ],
)
def test_recovery_log_resets_what_it_cannot_read(tmp_path: Path, content: bytes, why: str) -> None:
    warned: list[str] = []
    (tmp_path / "state.json").write_bytes(content)
    log = RecoveryLog(tmp_path / "state.json", warn=warned.append)
    assert log.recent("p", 60) == []
    (line,) = warned
    assert "is unreadable" in line and why in line and "starting it afresh" in line


def test_recovery_log_reads_no_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")  # O_NONBLOCK: opening it must not hang
    warned: list[str] = []
    assert RecoveryLog(tmp_path / "state.json", warn=warned.append).recent("p", 60) == []
    assert "not a regular file" in warned[0]
