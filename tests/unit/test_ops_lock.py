"""pdctl.ops.lock: this host's restart lock (refusal, other processes, planted links, the
wait, reading the holder)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from etcd3gw.exceptions import Etcd3Exception

from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Entry, Store, _reason
from pdctl.errors import PdctlError
from pdctl.ops import lock
from pdctl.topology import TopologyCoord


def test_lock_refusal_names_the_holder_and_is_released(tmp_path: Path) -> None:
    path = tmp_path / "run" / "restart.lock"
    with lock.held("pdctl restart --both --pair pd0", path):
        with pytest.raises(lock.LockHeld) as e, lock.held("second", path):
            pass
        assert "pdctl restart --both --pair pd0" in str(e.value)
        assert f"PID {__import__('os').getpid()}" in str(e.value)
        assert e.value.exit_code == 3
    with pytest.raises(RuntimeError), lock.held("third", path):
        raise RuntimeError("boom")
    with lock.held("fourth", path):  # released after the exception
        pass


def test_lock_conflicts_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "restart.lock"
    code = (
        "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR); "
        "fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)"
    )
    with lock.held("holder", path):
        held = subprocess.run(["python3", "-c", code, str(path)], capture_output=True)
    free = subprocess.run(["python3", "-c", code, str(path)], capture_output=True)
    assert held.returncode != 0 and free.returncode == 0


def test_lock_never_opens_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    link = tmp_path / "restart.lock"
    link.symlink_to(victim)
    with pytest.raises(PdctlError, match="is a symbolic link; refusing"), lock.held("x", link):
        pass
    assert victim.read_text() == "root:x:0:0\n"  # not truncated


def test_lock_wait_reports_progress_then_gives_up(tmp_path: Path) -> None:
    path, said = tmp_path / "restart.lock", []
    with (
        lock.held("pdctl restart --both --pair pd0", path),
        pytest.raises(lock.LockHeld, match=r"after waiting 0\.05s") as e,
        lock.held("recover", path, wait=0.05, say=said.append, poll=0.01),
    ):
        pass
    assert e.value.exit_code == 3
    assert said[0].startswith(f"waiting for the restart lock: PID {os.getpid()} pdctl restart")
    with lock.held("recover", path, wait=5, say=said.append) as got:  # free: no wait
        assert got == lock.Acquired(0.0, None)


def test_lock_holder_is_read_without_taking_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "restart.lock"
    assert lock.holder(path) is None  # no file yet
    before = time.time()
    with lock.held("pdctl restart --both --pair pd0", path):
        h = lock.holder(path)
        assert h is not None and h.pid == os.getpid()
        assert h.what == "pdctl restart --both --pair pd0"
        assert before - 1 <= h.since <= time.time() + 1
        with pytest.raises(lock.LockHeld), lock.held("second", path):
            pass  # reading it did not release it
    assert lock.holder(path) is None  # released: the line is gone
    # the line of a holder killed with SIGKILL stays in the file; no flock holds it
    dead = subprocess.run(["python3", "-c", "import os; print(os.getpid())"], capture_output=True)
    path.write_text(f"{dead.stdout.decode().strip()} pdctl restart --both --all\n")
    assert lock.holder(path) is None
    path.write_text(f"{os.getpid()} pdctl restart --both --all\n")  # alive, but no flock
    assert lock.holder(path) is None


class _AnswerLost(Store):
    """Every write transaction is committed, then sent again: the first answer was lost (etcd
    says "request timed out" when it cannot tell whether it committed), and Store._call tries
    the next member, which finds the key the first attempt made."""

    def create(self, key: str, value: bytes, lease: int) -> tuple[bool, Entry | None]:
        super().create(key, value, lease)
        return super().create(key, value, lease)


def test_a_lock_taken_whose_answer_was_lost_is_ours_not_another_holders(
    etcd_coord: TopologyCoord,
) -> None:
    fleet = RestartLock(_AnswerLost(etcd_coord), 30)
    with lock.fleet_held(fleet, "pdctl restart --both --pair a/pd0", say=lambda _l: None):
        held = fleet.holder()  # held, and still under this restart's lease: not revoked
        assert held is not None and held.pid == os.getpid()
        assert held.what == "pdctl restart --both --pair a/pd0"
    assert fleet.holder() is None


def test_etcd_out_of_space_is_named_with_its_fix() -> None:
    """etcd's NOSPACE alarm refuses every write with this text: one line, cause and fix."""
    said = _reason(Etcd3Exception('{"error":"etcdserver: mvcc: database space exceeded"}'))
    assert said.startswith("etcd is out of space (NOSPACE alarm")
    assert "docs/runbook.md#pdetcddatabasequotalowspace" in said
