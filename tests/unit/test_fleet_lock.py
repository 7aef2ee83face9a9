"""The fleet restart lock: the lease rules (pdctl.lockd.Leases, on a fake clock), the server
over HTTP (auth, persistence across a restart) and the client (pdctl.ops.lock: waiting,
takeover with a warning, heartbeat, release), and what the CLI does with it."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from pdctl import topology
from pdctl.lockd import Leases
from pdctl.ops import lock
from pdctl.ops.lock import AcquireRequest, FleetLock, FleetLockUnavailable, Grant, Holder
from pdctl.testing.fleetlock import lock_server
from pdctl.testing.stack import free_port, wait_until
from tests.conftest import one_pair_topology


def _req(host: str, pid: int = 42, what: str = "pdctl restart --both --pair pd0") -> Any:
    return AcquireRequest(host=host, pid=pid, what=what, ttl_s=30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ----- the lease rules ----------------------------------------------------------------------
def test_a_held_lease_is_refused_naming_its_holder_until_released() -> None:
    leases = Leases(None, Clock())
    first = leases.acquire(_req("pdf1", 4242))
    assert first.granted and first.token and first.took_over is None
    second = leases.acquire(_req("pdf2", 7, "pdctl recover --pair pdf2/pd1"))
    assert second.granted is False and second.token is None
    assert second.lease is not None
    assert (second.lease.host, second.lease.pid, second.lease.what) == (
        "pdf1",
        4242,
        "pdctl restart --both --pair pd0",
    )
    assert leases.release(first.token).granted
    assert leases.state().lease is None
    assert leases.acquire(_req("pdf2")).granted


def test_only_the_holder_renews_or_releases() -> None:
    leases = Leases(None, Clock())
    token = leases.acquire(_req("pdf1")).token
    assert token
    for wrong in ("not-the-token", token[:-1]):
        assert leases.renew(wrong).granted is False
        assert leases.release(wrong).granted is False
    assert leases.state().lease is not None  # still held
    assert leases.renew(token).granted and leases.release(token).granted
    assert leases.release(token).granted is False  # released once


def test_a_renewed_lease_stays_and_a_stale_one_is_taken_over_naming_the_dead_holder() -> None:
    clock = Clock()
    leases = Leases(None, clock)
    token = leases.acquire(_req("pdf1", 4242)).token
    assert token
    for _ in range(5):  # renewed every 20 s of a 30 s ttl: never stale
        clock.now += 20
        assert leases.renew(token).granted
        assert leases.acquire(_req("pdf2")).granted is False
    clock.now += 31  # no renewal for more than the ttl
    view = leases.state().lease
    assert view is not None and view.stale and view.heartbeat_age_s == 31
    taken = leases.acquire(_req("pdf2", 7))
    assert taken.granted and taken.took_over is not None
    assert (taken.took_over.host, taken.took_over.pid, taken.took_over.stale) == (
        "pdf1",
        4242,
        True,
    )
    # The dead holder, if it comes back, learns it lost the lease, and to whom.
    lost = leases.renew(token)
    assert lost.granted is False and lost.lease is not None and lost.lease.host == "pdf2"


def test_the_lease_survives_a_server_restart_with_a_fresh_ttl(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "lease.json"
    token = Leases(path, clock).acquire(_req("pdf1", 4242)).token
    assert token and os.stat(path).st_mode & 0o777 == 0o600
    clock.now += 120  # the server was down longer than the ttl
    again = Leases(path, clock)
    assert again.acquire(_req("pdf2")).granted is False  # still held: not freed, not stale
    assert again.renew(token).granted  # the holder's token still works
    assert again.release(token).granted
    assert Leases(path, clock).state().lease is None  # a release is kept too


def test_an_unreadable_lease_file_starts_free(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    path.write_text("{not json")
    assert Leases(path, Clock()).state().lease is None


# ----- the server over HTTP, and the client ---------------------------------------------------
def test_taking_needs_the_key_and_reading_does_not(tmp_path: Path) -> None:
    with lock_server(tmp_path / "lease.json", api_key="s3cret") as url:
        assert requests.get(f"{url}/lease", timeout=5).json()["lease"] is None
        for key in (None, "wrong"):
            with pytest.raises(FleetLockUnavailable, match="needs the gateway's API key"):
                FleetLock(url, key, 30).acquire("x")
        r = requests.post(f"{url}/lease/release", json={"token": "x"}, timeout=5)
        assert r.status_code == 401
        fleet = FleetLock(url, "s3cret", 30)
        got = fleet.acquire("pdctl restart --both --all")
        assert isinstance(got, Grant)
        holder = FleetLock(url, None, 30).holder()  # read without the key
        assert holder is not None and holder.what == "pdctl restart --both --all"
        bad = requests.post(f"{url}/lease", json={"host": "", "pid": 0}, headers=fleet.headers)
        assert bad.status_code == 400


def test_without_a_key_nothing_is_checked() -> None:
    with lock_server() as url:
        fleet = FleetLock(url, "any", 30)
        assert isinstance(fleet.acquire("pdctl restart --both " + "h/pd0 " * 1000), Grant)
        holder = fleet.holder()  # a roll of very many pairs: its command line, cut
        assert holder is not None and len(holder.what) == lock.WHAT_MAX
        assert holder.what.endswith("…")


def test_a_held_lock_survives_a_restart_of_its_server(tmp_path: Path) -> None:
    state, port = tmp_path / "lease.json", free_port()
    with lock_server(state, port=port) as url:
        got = FleetLock(url, None, 30).acquire("pdctl restart --both --pair pd0")
        assert isinstance(got, Grant)
    with lock_server(state, port=port) as url:
        second = FleetLock(url, None, 30).acquire("pdctl recover --pair pd1")
        assert isinstance(second, Holder) and second.what == "pdctl restart --both --pair pd0"
        assert FleetLock(url, None, 30).renew(got.token)[0]


def test_a_second_restarter_waits_with_progress_then_gives_up_naming_the_holder() -> None:
    said: list[str] = []
    with (
        lock_server() as url,
        lock.fleet_held(FleetLock(url, None, 30), "pdctl restart --all"),
        pytest.raises(lock.LockHeld) as e,
        lock.fleet_held(FleetLock(url, None, 30), "recover", 0.3, said.append, 0.05),
    ):
        pass
    me = f"{socket.gethostname()} PID {os.getpid()} pdctl restart --all, since "
    assert e.value.exit_code == 3
    assert str(e.value).startswith(f"another restart is running: {me}")
    assert "after waiting 0.3s" in str(e.value)
    assert said[0].startswith(f"waiting for the fleet restart lock, held by {me}")


def test_a_dead_holder_is_taken_over_with_a_warning() -> None:
    said: list[str] = []
    with lock_server() as url:
        dead = FleetLock(url, None, 1.0).acquire("pdctl restart --both --pair pd0")  # never renewed
        assert isinstance(dead, Grant)
        fleet = FleetLock(url, None, 1.0)
        with lock.fleet_held(fleet, "pdctl recover --pair pd0", 30, said.append, 0.05) as got:
            assert got.took_over is not None and "pdctl restart --both --pair pd0" in got.took_over
            ours, now = FleetLock(url, None, 1.0).renew(dead.token)
            assert not ours and now is not None and now.what == "pdctl recover --pair pd0"
    warning = [line for line in said if line.startswith("WARNING: took over")]
    assert len(warning) == 1 and "pdctl restart --both --pair pd0" in warning[0], said
    assert "presumed dead" in warning[0]


def test_the_heartbeat_keeps_a_long_restart_holding_the_lock() -> None:
    with lock_server() as url:
        fleet = FleetLock(url, None, 1.0)
        with lock.fleet_held(fleet, "pdctl restart --both --all", say=print):
            for _ in range(6):  # three ttls: held throughout, never stale
                time.sleep(0.5)
                holder = fleet.holder()
                assert holder is not None and not holder.stale
                with pytest.raises(lock.LockHeld), lock.fleet_held(FleetLock(url, None, 1), "2nd"):
                    pass
        assert fleet.holder() is None  # released at the end


def test_the_heartbeat_says_loudly_when_the_lock_server_is_gone_longer_than_the_ttl() -> None:
    said: list[str] = []
    port = free_port()
    with lock_server(port=port) as url:
        fleet = FleetLock(url, None, 1.0)
        held = lock.fleet_held(fleet, "pdctl restart --both --all", say=said.append)
        got = held.__enter__()
        assert got.lost() is None
    # the server is gone while the restart goes on
    wait_until(lambda: any("was not renewed for" in line for line in said), 10, "the warning")
    assert (got.lost() or "").startswith("not renewed for")  # a roll stops before its next pair
    held.__exit__(None, None, None)
    (warning,) = [line for line in said if "was not renewed for" in line]
    assert warning.startswith("WARNING: the fleet restart lock was not renewed")
    assert "Another restarter may take it over" in warning
    assert any("could not release the fleet restart lock" in line for line in said)


def test_no_answer_refuses_with_its_own_exit_code() -> None:
    fleet = FleetLock(f"http://127.0.0.1:{free_port()}", None, 30)
    with (
        pytest.raises(FleetLockUnavailable, match="--no-fleet-lock") as e,
        lock.held("pdctl restart --both --all", fleet=fleet),
    ):
        pass
    assert e.value.exit_code == 5


# ----- the CLI ------------------------------------------------------------------------------
@pytest.fixture
def topo_with_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    monkeypatch.delenv("PDCTL_FLEET_LOCK", raising=False)
    monkeypatch.delenv("PDSTACK_INVENTORY", raising=False)

    def write(url: str) -> Path:
        topo = one_pair_topology(
            "node-a",
            "http://127.0.0.1:1",
            "http://127.0.0.1:1",
            bootstrap_port=1,
            router_url="http://127.0.0.1:1",
            metrics_url="http://127.0.0.1:1/metrics",
        )
        lock_at = topology.TopologyLock(host="node-a", url=url, ttl_s=30)
        path = tmp_path / "topology.yaml"
        path.write_text(topology.dump(topo.model_copy(update={"lock": lock_at})))
        return path

    return write


def test_restart_exits_3_naming_the_fleet_lock_holder(
    topo_with_lock: Callable[[str], Path], pdctl: Callable[..., Any]
) -> None:
    with lock_server() as url:
        path = topo_with_lock(url)
        with lock.fleet_held(FleetLock(url, None, 30), "pdctl restart --both --pair pdf1/pd0"):
            r = pdctl("restart", "--both", "--all", "--yes", "--topology", str(path))
    assert r.exit_code == 3, r.stderr
    me = f"{socket.gethostname()} PID {os.getpid()} pdctl restart --both --pair pdf1/pd0, since"
    assert me in r.stderr


def test_restart_refuses_when_the_lock_does_not_answer_unless_told(
    topo_with_lock: Callable[[str], Path], pdctl: Callable[..., Any]
) -> None:
    path = topo_with_lock(f"http://127.0.0.1:{free_port()}")
    r = pdctl("restart", "--both", "--all", "--yes", "--topology", str(path))
    assert (
        r.exit_code == 5
        and "does not answer" in (r.stdout + r.stderr)
        and "--no-fleet-lock" in (r.stdout + r.stderr)
    )
    # With the override it goes on (and fails later, at the gateway nobody runs), warned.
    r = pdctl("restart", "--both", "--all", "--yes", "--no-fleet-lock", "--topology", str(path))
    assert "WARNING: --no-fleet-lock" in (r.stdout + r.stderr) and r.exit_code == 1, (
        r.stdout + r.stderr
    )
