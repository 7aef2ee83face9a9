"""The coordination store against a real etcd (Debian's etcd-server), one member or three:
the fleet restart lock as a lease with its fencing check, the restart history, the gateways'
liveness keys, and what each says when etcd cannot serve."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from pdctl import topology
from pdctl.coord import gateways, restarts
from pdctl.coord.history import History, Outcome
from pdctl.coord.kv import KV, Entry
from pdctl.coord.lock import KEY, Grant, Holder, RestartLock
from pdctl.coord.store import Store, StoreUnavailable
from pdctl.ops import lock
from pdctl.testing.etcd import LocalEtcd, local_etcd
from pdctl.topology import TopologyCoord
from tests.conftest import one_pair_topology, run_pdctl

HOST = socket.gethostname()

# A holder in a process of its own: takes the lock, says so, then on each line of stdin
# prints what the fencing check before a restart's next step says.
HOLDER = """
import sys
from pdctl.coord.lock import RestartLock
from pdctl.coord.store import Store
from pdctl.ops import lock
from pdctl.topology import TopologyCoord
from tests.conftest import one_pair_topology, run_pdctl
c = TopologyCoord.model_validate_json(sys.argv[1])
with lock.fleet_held(RestartLock(Store(c), c.lock_ttl_s), sys.argv[2]) as got:
    print("holding", flush=True)
    for _ in sys.stdin:
        print(f"lost: {got.lost()}", flush=True)
"""


@pytest.fixture
def three(tmp_path: Path) -> Iterator[LocalEtcd]:
    with local_etcd(tmp_path / "etcd", size=3) as etcd:
        yield etcd


def _holder(coord: TopologyCoord, what: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, coord.model_dump_json(), what],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "holding\n"
    return p


def test_one_holder_at_a_time_and_the_second_is_told_who(etcd_coord: TopologyCoord) -> None:
    fleet = RestartLock(Store(etcd_coord), 30)
    first = fleet.acquire("pdctl restart --both --pair a/pd0", ["a/pd0"])
    assert isinstance(first, Grant)
    second = fleet.acquire("pdctl recover --pair b/pd1", ["b/pd1"])
    assert isinstance(second, Holder)
    assert (second.host, second.pid, second.what, second.targets) == (
        HOST,
        os.getpid(),
        "pdctl restart --both --pair a/pd0",
        ("a/pd0",),
    )
    assert second.ttl_s == 30 and 0 <= (second.heartbeat_age_s or 0) < 5
    assert fleet.check(first) is None and fleet.renew(first) == (True, None)
    fleet.release(first)
    assert fleet.holder() is None and fleet.check(first) == (
        "its lease expired and nobody holds the lock now"
    )
    assert isinstance(fleet.acquire("pdctl recover --pair b/pd1"), Grant)


def test_a_killed_holder_frees_the_lock_after_its_ttl(etcd_coord: TopologyCoord) -> None:
    holder = _holder(etcd_coord, "pdctl restart --all")
    fleet = RestartLock(Store(etcd_coord), etcd_coord.lock_ttl_s)
    held = fleet.holder()
    assert held is not None and held.pid == holder.pid
    holder.kill()
    holder.wait(10)
    said: list[str] = []
    with lock.fleet_held(fleet, "pdctl restart --both --pair a/pd0", 30, said.append, 0.2) as got:
        assert got.behind is not None and f"PID {holder.pid} pdctl restart --all" in got.behind
        assert got.took_over == f"{HOST} PID {holder.pid} pdctl restart --all"
        got.record(Outcome(result="ok", targets=["a/pd0"], phases={"a/pd0": {"drain": 0.5}}))
    newest, lost = History(fleet.store).records()
    assert (newest.result, newest.targets, newest.phases) == (
        "ok",
        ["a/pd0"],
        {"a/pd0": {"drain": 0.5}},
    )
    assert (lost.pid, lost.result) == (holder.pid, "lost")
    assert any(line.startswith("waiting for the fleet restart lock, held by") for line in said)


def test_a_paused_holder_loses_the_lock_and_stops_before_its_next_step(
    etcd_coord: TopologyCoord,
) -> None:
    """SIGSTOP past the ttl: another restarter takes the lock; the paused one, resumed, is
    told by its fencing check that the lock is another's now."""
    paused = _holder(etcd_coord, "pdctl restart --all")
    assert paused.stdin is not None and paused.stdout is not None
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        fleet = RestartLock(Store(etcd_coord), etcd_coord.lock_ttl_s)
        with lock.fleet_held(fleet, "pdctl recover --pair a/pd0", 30, lambda _: None, 0.2):
            os.kill(paused.pid, signal.SIGCONT)
            paused.stdin.write("next step\n")
            paused.stdin.flush()
            answer = paused.stdout.readline()
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        paused.kill()
        paused.wait(10)
    assert answer.startswith("lost: its lease expired")
    assert f"{HOST} PID {os.getpid()} pdctl recover --pair a/pd0" in answer


def test_lock_show_break_and_history_name_the_holder(
    etcd_coord: TopologyCoord, tmp_path: Path
) -> None:
    topo = tmp_path / "topology.yaml"
    url = "http://127.0.0.1:9"
    t = one_pair_topology(
        "node-a", url, url, bootstrap_port=1, gateway_url=url, metrics_url=url + "/metrics"
    )
    topo.write_text(topology.dump(t.model_copy(update={"coord": etcd_coord})))
    where = ("--topology", str(topo))
    holder = _holder(etcd_coord, "pdctl restart --both --pair a/pd0")
    try:
        shown = json.loads(run_pdctl("lock", "show", "--format", "json", *where).stdout)
        assert shown["held"] and shown["holder"]["pid"] == holder.pid
        assert shown["holder"]["command"] == "pdctl restart --both --pair a/pd0"
        refused = run_pdctl("lock", "break", *where)
        assert refused.exit_code == 2 and "add --force" in refused.stderr
        broke = run_pdctl("lock", "break", "--force", *where)
        assert broke.exit_code == 0, broke.stderr
        assert f"it was held by {HOST} PID {holder.pid} pdctl restart --both --pair a/pd0" in (
            broke.stdout
        )
        assert run_pdctl("lock", "show", *where).stdout == "free\n"
        again = run_pdctl("lock", "break", "--force", *where)  # nothing held: nothing changes
        assert (again.exit_code, again.stdout, again.stderr) == (
            0,
            "the fleet restart lock is free: nothing to break\n",
            "",
        )
    finally:
        holder.kill()
        holder.wait(10)
    listed = json.loads(run_pdctl("history", "--format", "json", *where).stdout)["restarts"]
    assert [(r["pid"], r["result"]) for r in listed] == [(holder.pid, "running")]
    table = run_pdctl("history", *where).stdout
    assert f"{holder.pid}  RUNNING" in table and "pdctl restart --both --pair a/pd0" in table


class _ReadBefore:
    """The store as a breaker saw it: its first read of the lock is the `seen` entry, taken
    before another restarter took the lock; everything else is the real store's."""

    def __init__(self, store: Store, seen: Entry) -> None:
        self.store, self.seen = store, seen

    def get(self, key: str) -> Entry | None:
        return self.seen

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def test_lock_break_ends_only_the_holder_it_read(etcd_coord: TopologyCoord) -> None:
    """Between the breaker's read and its break the old holder's lease ends and another takes
    the lock: the break must leave the new holder's key (it revokes the lease it read)."""
    store = Store(etcd_coord)
    fleet = RestartLock(store, 30)
    old = fleet.acquire("pdctl restart --both --pair a/pd0", ["a/pd0"])
    assert isinstance(old, Grant)
    seen = store.get(KEY)
    assert seen is not None
    store.revoke(old.lease)  # its holder's lease expired
    new = fleet.acquire("pdctl recover --pair a/pd0", ["a/pd0"])
    assert isinstance(new, Grant)
    broke = RestartLock(cast(KV, _ReadBefore(store, seen)), 30).force_break()
    assert broke is not None and broke.lease == old.lease
    assert fleet.check(new) is None  # the new holder keeps it


def test_a_lock_record_of_an_older_pdctl_is_read(etcd_coord: TopologyCoord) -> None:
    """`what` (before `command`), no `targets`, and a field this pdctl does not know."""
    store = Store(etcd_coord)
    lease = store.grant(30)
    old = {"host": "ctl", "pid": 7, "what": "pdctl restart --all", "since": 1.0, "ttl_s": 30}
    store.put(KEY, json.dumps({**old, "from_the_future": [1]}).encode(), lease)
    held = RestartLock(store, 30).holder()
    assert held is not None
    assert (held.host, held.pid, held.what, held.targets) == ("ctl", 7, "pdctl restart --all", ())
    store.revoke(lease)


def test_history_is_bounded_and_newest_first(etcd_coord: TopologyCoord) -> None:
    history = History(Store(etcd_coord), keep=3)
    for n in range(5):
        history.finish(history.start(f"restart {n}"), Outcome(result="ok"))
    assert [r.command for r in history.records()] == ["restart 4", "restart 3", "restart 2"]


def test_a_gateway_key_lives_while_its_heartbeat_runs(etcd_coord: TopologyCoord) -> None:
    store, stop = Store(etcd_coord), threading.Event()
    said: list[str] = []
    beat = threading.Thread(
        target=gateways.heartbeat,
        args=(store, "gw-1", "http://10.0.0.1:8000", etcd_coord.gateway_ttl_s, stop, said.append),
    )
    beat.start()
    deadline = time.monotonic() + 10
    while "gw-1" not in gateways.alive(store):
        assert time.monotonic() < deadline, said
        time.sleep(0.1)
    time.sleep(etcd_coord.gateway_ttl_s * 1.5)  # renewed past its ttl
    assert gateways.alive(store)["gw-1"].url == "http://10.0.0.1:8000"
    stop.set()
    beat.join(10)
    assert gateways.alive(store) == {}  # revoked at once when it stops


def test_without_quorum_every_call_says_so_in_one_line(three: LocalEtcd) -> None:
    store = Store(three.coord)
    store.put("k", b"v")
    three.stop(0)  # one member of three lost: the others serve
    assert store.get("k") is not None and store.get("k").value == b"v"  # type: ignore[union-attr]
    three.stop(1)
    with pytest.raises(StoreUnavailable) as e:
        store.get("k")
    up, down = three.members[2].client_url, [m.client_url for m in three.members[:2]]
    assert str(e.value) == (
        f"cannot read: etcd has no quorum: 1 of 3 members answer ({up}) and none knows a "
        f"leader; down: {', '.join(down)}"
    )
    three.stop(2)
    with pytest.raises(StoreUnavailable, match=r"^cannot read: no etcd member answers \("):
        store.get("k")


def test_a_restart_refuses_at_once_without_quorum_and_a_recovery_waits_for_it(
    three: LocalEtcd,
) -> None:
    fleet = RestartLock(Store(three.coord), three.coord.lock_ttl_s)
    three.stop(0)
    three.stop(1)
    with (
        pytest.raises(StoreUnavailable, match="etcd has no quorum") as refused,
        lock.fleet_held(fleet, "pdctl restart --all"),
    ):
        pass
    assert "not restarting without the fleet restart lock" in str(refused.value)
    waits: list[str] = []

    def waited(why: str, holder: Holder | None) -> None:
        assert holder is None  # etcd cannot tell who holds it
        waits.append(why)

    def quorum_back() -> None:
        while len(waits) < 2:
            time.sleep(0.1)
        three.start(0)

    t = threading.Thread(target=quorum_back)
    t.start()
    with lock.fleet_held(
        fleet,
        "pdctl recover --pair a/pd0",
        60,
        lambda _: None,
        0.2,
        store_wait=True,
        on_wait=waited,
    ):
        pass
    t.join(10)
    assert waits[0].startswith("etcd cannot serve: cannot grant a lease: etcd has no quorum")


def test_a_restart_goes_on_through_the_store_leaders_death(three: LocalEtcd) -> None:
    """SIGKILL of etcd's leader between two steps: the fencing read and the next phase write
    reach the new leader (within the election), and the lock stays the restart's."""
    store = Store(three.coord)
    fleet = RestartLock(store, three.coord.lock_ttl_s)
    with lock.fleet_held(fleet, "pdctl restart --both a/pd0", targets=["a/pd0"]) as got:
        assert got.phases is not None and got.phases.enter("a/pd0", "drain")
        (leader,) = [i for i, m in enumerate(store.members()) if m.is_leader]
        proc = three.members[leader].proc
        assert proc is not None
        proc.kill()  # by PID
        proc.wait(10)
        three.members[leader].proc = None
        deadline = time.monotonic() + 20
        while True:
            try:
                if got.lost() is None and got.phases.enter("a/pd0", "stop"):
                    break
            except StoreUnavailable:
                pass  # no leader yet: a restart stops here and says so; this test waits
            assert time.monotonic() < deadline, "no new leader within 20 s"
            time.sleep(0.2)
        assert restarts.abandoned(store) == []  # its record is under the live lease
        assert got.phases.done("a/pd0")
    assert fleet.holder() is None and store.list(restarts.PREFIX) == []
