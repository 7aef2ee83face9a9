"""pdctl status/doctor/restart against local sim engines behind the real gateway (smg).

Engines are local processes; `pdctl.testing.localproc.LocalUnits` stands in for systemd
(start/stop by PID, a pair target names its two units). Everything else is the real code
path: the gateway admin API, /health, the pair canary, the restart locks (this host's flock and
the fleet lock's lease in a real one-member etcd, pdctl.testing.etcd).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from pdctl import topology
from pdctl.coord.history import History
from pdctl.coord.lock import Grant
from pdctl.coord.restarts import Phases
from pdctl.ops import finish, lock, restart, roll
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.doctor import doctor
from pdctl.ops.recover import RateLimit, RecoveryLog, recover
from pdctl.ops.restart import (
    Interrupted,
    Report,
    register_pair,
    restart_instance,
    restart_pair,
    restart_pairs,
    stop_pair,
)
from pdctl.ops.source import Pair
from pdctl.ops.status import collect
from pdctl.pdclient import pair_canary
from pdctl.testing.etcd import LocalEtcd, local_etcd
from pdctl.testing.localproc import LocalPair, LocalUnits, local_ops
from pdctl.testing.stack import (
    Gateway,
    SimProc,
    constant_load,
    cross_group_transfers,
    partner_env,
    wait_until,
)
from pdctl.topology import TopologyCoord

pytestmark = pytest.mark.gateway

# The modelled degraded pair (PDSIM_DEGRADED=on: the production failure after a lone decode
# restart, which NIXL over host memory cannot show) fails most requests, so an 8-request
# canary cannot miss it by chance.
ENV = {"PDSIM_DEGRADED": "on", "PDSIM_DEGRADED_FAIL_RATIO": "0.8"}
SMG_DRAIN_WINDOW_S = 5  # smg 1.13 removes a drained worker this long after its DELETE


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """The coordination store: a real one-member etcd as a local process."""
    with local_etcd(tmp_path / "etcd") as e:
        yield e


@pytest.fixture
def coord(etcd: LocalEtcd) -> TopologyCoord:
    return etcd.coord


@pytest.fixture
def local_pairs(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    coord: TopologyCoord,
) -> Callable[[int], tuple[Ops, LocalUnits]]:
    """N local pairs behind one real gateway, under the fleet lock in a real etcd."""

    def make(n_pairs: int) -> tuple[Ops, LocalUnits]:
        monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
        pairs = []
        for n in range(n_pairs):
            prefill = sim_factory("prefill", env=ENV)
            decode = sim_factory("decode", env={**ENV, **partner_env(prefill)})
            pairs.append(LocalPair(f"pd{n}", prefill, decode))
        for p in pairs:
            p.prefill.wait_healthy()
            p.decode.wait_healthy()
        # The gateway's default retries and round_robin, as deployed. The workers are
        # registered the way pdctl registers them (pdctl.ops.restart.register_pair): each
        # pair's two bound to each other by smg's pairing protocol. Without that, smg's round
        # robin combines workers of different pairs from the start and after
        # re-registrations, which the sim (like NIXL) fails with stale peer metadata once one
        # of them restarted (docs/gateway.md, "Groups stay groups").
        gw = gateway_factory([], [], "--policy", "round_robin")
        ops, units = local_ops(pairs, gw, coord=coord)
        for pair in ops.source.pairs():
            register_pair(ops, pair)
        gw.wait_ready()
        ops.say = lambda line: print(line, file=sys.stderr)
        return ops, units

    return make


@pytest.fixture
def two_pairs(local_pairs: Callable[[int], tuple[Ops, LocalUnits]]) -> tuple[Ops, LocalUnits]:
    return local_pairs(2)


def _registered(ops: Ops) -> set[str]:
    return {w.url for w in ops.gateways[0].workers() if w.healthy and w.status == "ready"}


@pytest.fixture
def watch_gateway(two_pairs: tuple[Ops, LocalUnits]) -> Iterator[list[set[str]]]:
    """Snapshots of the gateway's ready workers, taken every 50 ms."""
    ops, _ = two_pairs
    seen: list[set[str]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(_registered(ops))
            time.sleep(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    yield seen
    done.set()
    t.join(5)


def test_restart_both_drains_restarts_and_reregisters(
    two_pairs: tuple[Ops, LocalUnits], watch_gateway: list[set[str]]
) -> None:
    ops, units = two_pairs
    pd0, pd1 = ops.source.pairs()
    old_pids = {i.unit: units.show(i.unit).main_pid for i in pd0.instances}
    rep = restart_pair(ops, pd0)
    assert rep.ok, (rep.error, rep.journal)
    assert list(rep.phases) == ["drain", "stop", "start", "health", "canary", "verify", "register"]
    assert [line.split(":")[0] for line in rep.lines] == ["OK", "OK"]
    assert all(units.show(u).main_pid not in (0, pid) for u, pid in old_pids.items())
    # The gateway stopped routing to pd0 while it restarted, and routes to it again now.
    pd0_urls = {i.url for i in pd0.instances}
    assert any(not (pd0_urls & snap) for snap in watch_gateway)
    assert pd0_urls | {i.url for i in pd1.instances} <= _registered(ops)
    # pd1 was never touched.
    assert all(u not in {i.unit for i in pd1.instances} for _, u in units.jobs)
    assert ("stop", pd0.decodes[0].unit) in units.jobs


def test_doctor_finds_degraded_pair_after_lone_decode_restart(
    two_pairs: tuple[Ops, LocalUnits],
) -> None:
    ops, _ = two_pairs
    pd0 = ops.source.pairs()[0]
    assert not [f for f in doctor(ops)[0] if f.id.startswith("live-")]
    assert restart_instance(ops, pd0.decodes[0]).ok
    findings, status = doctor(ops)
    degraded = [f for f in findings if f.id == "live-degraded-pair"]
    assert [f.where for f in degraded] == [pd0.id], findings
    assert f"run pdctl restart --both --pair {pd0.id}" == degraded[0].fix
    assert all(i.probe.healthy for i in status.instances)  # /health cannot see it
    assert restart_pair(ops, pd0).ok
    assert not [f for f in doctor(ops)[0] if f.id.startswith("live-")]


def test_a_restart_from_another_host_waits_then_exits_3_naming_the_holder(
    two_pairs: tuple[Ops, LocalUnits], tmp_path: Path
) -> None:
    """Two restarters on two "hosts" (each its own host lock): the fleet lock lets one run;
    the other waits its --lock-wait, saying so, then exits 3 naming the first."""
    ops, _ = two_pairs
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(topology.dump(ops.source.topology))
    holding = threading.Event()
    result: list[bool] = []

    def first() -> None:
        with lock.held("pdctl restart --both --pair pd0", fleet=ops.fleet_lock):
            holding.set()
            result.append(restart_pair(ops, ops.source.pairs()[0]).ok)

    t = threading.Thread(target=first)
    t.start()
    holding.wait(10)
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pdctl.cli import main; main()",
            "restart",
            "--both",
            "--all",
            "--yes",
            "--lock-wait",
            "1",
            "--topology",
            str(topo_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PDCTL_LOCK": str(tmp_path / "other-host" / "restart.lock")},
    )
    t.join(120)
    assert second.returncode == 3, second.stderr
    first_one = f"{socket.gethostname()} PID {os.getpid()} pdctl restart --both --pair pd0"
    assert f"waiting for the fleet restart lock, held by {first_one}, since" in second.stderr
    assert f"another restart is running: {first_one}, since" in second.stderr
    assert "after waiting 1s" in second.stderr
    assert result == [True]
    assert ops.fleet_lock is not None and ops.fleet_lock.holder() is None  # released


def test_a_killed_holder_is_taken_over_with_a_warning(
    two_pairs: tuple[Ops, LocalUnits], coord: TopologyCoord
) -> None:
    """A restarter SIGKILLed mid-restart (or its host lost) stops renewing its lease: after
    the ttl etcd frees the lock, the next restart takes it and says whom it followed."""
    ops, _ = two_pairs
    pd0 = ops.source.pairs()[0]
    code = (
        "import sys, time\n"
        "from pdctl.coord.lock import RestartLock\n"
        "from pdctl.coord.store import Store\n"
        "from pdctl.ops import lock\n"
        "from pdctl.topology import TopologyCoord\n"
        "c = TopologyCoord.model_validate_json(sys.argv[1])\n"
        "with lock.fleet_held(RestartLock(Store(c), c.lock_ttl_s), sys.argv[2]):\n"
        "    print('holding', flush=True)\n"
        "    time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            coord.model_dump_json(),
            "pdctl restart --both --pair local/pd1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    said: list[str] = []
    with lock.held(
        "pdctl recover --pair local/pd0", None, 60, said.append, 0.2, ops.fleet_lock
    ) as got:
        rep = restart_pair(ops, pd0)
    dead = f"{socket.gethostname()} PID {holder.pid} pdctl restart --both --pair local/pd1"
    assert got.took_over == dead
    (warning,) = [line for line in said if line.startswith("WARNING: the last holder")]
    assert dead in warning and "lost it before it finished (its lease expired" in warning
    (lost,) = [r for r in History(ops.fleet_lock.store).records() if r.pid == holder.pid]
    assert lost.result == "lost" and lost.command == "pdctl restart --both --pair local/pd1"
    assert rep.ok, (rep.error, rep.journal)
    assert ops.fleet_lock is not None and ops.fleet_lock.holder() is None


def test_restart_all_under_load_fails_no_client_request(
    two_pairs: tuple[Ops, LocalUnits],
) -> None:
    ops, _ = two_pairs
    with constant_load(ops.source.topology.gateways[0].url, timeout=30) as outcomes:
        wait_until(lambda: len(outcomes) >= 20, 30, "load to flow")
        reports = restart_pairs(ops, ops.source.pairs())
        before_end = len(outcomes)
        wait_until(lambda: len(outcomes) >= before_end + 20, 30, "load after the restarts")
    assert [r.ok for r in reports] == [True, True], [r.error for r in reports]
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    assert len(outcomes) > 100


def test_a_roll_of_two_at_a_time_under_load_fails_no_request_and_keeps_the_floor(
    local_pairs: Callable[[int], tuple[Ops, LocalUnits]],
) -> None:
    """Four pairs, --max-unavailable 2 (floor: 2), under streaming load through the real
    gateway, under the fleet lock in a real etcd: no failed request, two pairs out at once,
    and the gateway's own worker list (polled every 50 ms) never routing to fewer than 2."""
    ops, _ = local_pairs(4)
    pairs = ops.source.pairs()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, file=sys.stderr)

    ops.say = say
    routed: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            ready = _registered(ops)
            routed.append(sum({i.url for i in p.instances} <= ready for p in pairs))
            time.sleep(0.05)

    budget = roll.budget("2", None, len(pairs))
    chosen = roll.prepare(ops, pairs, 2, include_drained=False)
    watcher = threading.Thread(target=poll, daemon=True)
    with constant_load(ops.source.topology.gateways[0].url, timeout=30) as outcomes:
        wait_until(lambda: len(outcomes) >= 20, 30, "load to flow")
        watcher.start()
        with lock.held("pdctl restart --both --all", fleet=ops.fleet_lock) as got:
            reports = restart_pairs(ops, chosen, got.lost, budget)
        done.set()
        watcher.join(5)
        before_end = len(outcomes)
        wait_until(lambda: len(outcomes) >= before_end + 20, 30, "load after the roll")
    assert [r.ok for r in reports] == [True] * 4, [r.error for r in reports]
    assert "roll: out local/pd0, local/pd1; done 0 of 4; left 2" in lines  # two out at once
    assert routed and min(routed) >= 2, routed
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    assert len(outcomes) > 100


def test_status_sees_every_instance_and_the_gateway(two_pairs: tuple[Ops, LocalUnits]) -> None:
    ops, units = two_pairs
    s = collect(ops)
    assert s.healthy
    assert {i.instance.id for i in s.instances} == {
        "local/pd0-prefill",
        "local/pd0-decode",
        "local/pd1-prefill",
        "local/pd1-decode",
    }
    assert all([w and w.status for w in i.workers] == ["ready"] for i in s.instances)
    pd1 = ops.source.pairs()[1]
    units.stop(pd1.decodes[0].unit)
    s = collect(ops)
    assert not s.healthy
    (bad,) = [p for p in s.pairs if not p.canary.ok]
    assert bad.id == pd1.id
    down = {i.instance.id: i for i in s.instances}[pd1.decodes[0].id]
    assert down.unit is not None and down.unit.active == "inactive"
    assert down.probe.health.startswith("unreachable")


def test_local_topology_round_trips(two_pairs: tuple[Ops, LocalUnits], tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(topology.dump(ops_topology := two_pairs[0].source.topology))
    assert topology.read(path) == ops_topology


def _decodes(units: LocalUnits) -> list[SimProc]:
    return [sim for sim in units.procs.values() if sim.mode == "decode"]


def test_requests_stay_inside_pairs_through_drain_and_reregister_cycles(
    two_pairs: tuple[Ops, LocalUnits], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round robin over two pairs, three rolls of both pairs under streaming load: no failed
    request, no KV transfer across pairs. A decode's counter dies with it, so it is read
    just before every stop (the drain has let in-flight requests finish by then)."""
    ops, units = two_pairs
    snapshots: list[dict[str, float]] = []
    stop = units.stop

    def stop_after_reading(*names: str) -> None:
        snapshots.append(cross_group_transfers(_decodes(units)))
        stop(*names)

    monkeypatch.setattr(units, "stop", stop_after_reading)
    rolls = 3
    with constant_load(ops.source.topology.gateways[0].url, timeout=30) as outcomes:
        wait_until(lambda: len(outcomes) >= 20, 30, "load to flow")
        reports = [r for _ in range(rolls) for r in restart_pairs(ops, ops.source.pairs())]
        before_end = len(outcomes)
        wait_until(lambda: len(outcomes) >= before_end + 50, 30, "load after the rolls")
    snapshots.append(cross_group_transfers(_decodes(units)))
    assert [r.ok for r in reports] == [True] * 2 * rolls, [r.error for r in reports]
    assert len(snapshots) == 2 * rolls + 1 and all(len(s) == 2 or len(s) == 1 for s in snapshots)
    crossed = [s for s in snapshots if any(s.values())]
    assert not crossed, f"KV transfers across pairs: {crossed}"
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    assert len(outcomes) > 200


def test_an_interrupted_restart_leaves_the_pair_drained_until_restart_both(
    two_pairs: tuple[Ops, LocalUnits],
) -> None:
    ops, _ = two_pairs
    pd0, pd1 = ops.source.pairs()

    def ctrl_c(*_: object) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("pdctl.ops.restart._first_canary", ctrl_c)  # ^C once both are healthy
        with pytest.raises(Interrupted, match=f"during canary of group {pd0.id}: it is out of"):
            restart_pair(ops, pd0)
    s = collect(ops, 1)
    assert {p.id: p.gateway for p in s.pairs} == {pd0.id: "drained", pd1.id: "routed"}
    assert not s.healthy
    again = restart_pair(ops, pd0)  # the command the message names puts it back
    assert again.ok, (again.error, again.lines, again.journal)
    assert {p.gateway for p in collect(ops, 1).pairs} == {"routed"}
    # and keeps it: had the second drain sent its DELETE again to workers smg was still
    # draining, smg would run a second removal that takes the re-registered pair out once its
    # drain window (5 s) ends.
    time.sleep(SMG_DRAIN_WINDOW_S + 1)
    assert {p.gateway for p in collect(ops, 1).pairs} == {"routed"}


def test_recover_waits_for_a_running_restart_then_recovers(
    two_pairs: tuple[Ops, LocalUnits], tmp_path: Path
) -> None:
    """An operator's restart runs elsewhere (another host lock), holding the fleet lock."""
    ops, units = two_pairs
    pd0, pd1 = ops.source.pairs()
    said: list[str] = []
    ops.say = said.append
    holding, rolled = threading.Event(), []
    elsewhere = tmp_path / "other-host" / "restart.lock"

    def operator_restart() -> None:
        with lock.held("pdctl restart --both --pair pd1", elsewhere, fleet=ops.fleet_lock):
            holding.set()
            rolled.append(restart_pair(ops, pd1).ok)

    t = threading.Thread(target=operator_restart)
    t.start()
    holding.wait(10)
    units.stop(pd0.decodes[0].unit)  # pd0's decode dies while pd1's restart holds the lock
    log = RecoveryLog(tmp_path / "state" / "recover.json")
    rep = recover(ops, pd0, RateLimit(), log, lock_wait=300)
    t.join(120)
    assert rolled == [True] and rep.ok, (rep.error, rep.journal)
    assert any(line.startswith("waiting for the fleet restart lock, held by") for line in said)
    # While it waited, pd0 (not the pair the holder restarts) was out of the gateway, stopped.
    assert any(line.startswith(f"{pd0.id}: out of every gateway that answers") for line in said)
    assert said[-1].startswith(f"{pd0.id}: recovered: restarted prefill and decode together")
    assert "after waiting" in said[-1] and "pdctl restart --both --pair pd1" in said[-1]
    assert collect(ops, 1).healthy


def test_recover_without_etcd_contains_its_pair_then_recovers_once_etcd_is_back(
    two_pairs: tuple[Ops, LocalUnits], etcd: LocalEtcd, tmp_path: Path
) -> None:
    """A decode dies while etcd cannot serve: the recovery takes the pair out of the gateway
    and stops its live prefill while it waits (no request meets a half pair), then recovers
    it as soon as etcd answers again."""
    ops, units = two_pairs
    pd0, pd1 = ops.source.pairs()
    said: list[str] = []
    ops.say = said.append
    units.stop(pd0.decodes[0].unit)
    etcd.stop(0)
    done: list[Report] = []
    log = RecoveryLog(tmp_path / "state" / "recover.json")
    t = threading.Thread(
        target=lambda: done.append(recover(ops, pd0, RateLimit(), log, lock_wait=120))
    )
    t.start()
    wait_until(
        lambda: any("out of every gateway that answers" in line for line in said), 30, "containment"
    )
    assert not _registered(ops) & {i.url for i in pd0.instances}
    assert units.show(pd0.prefills[0].unit).active != "active"  # no live half left
    assert {i.url for i in pd1.instances} <= _registered(ops)  # the other pair serves on
    assert not done  # still waiting for etcd
    etcd.start(0)
    t.join(120)
    (rep,) = done
    assert rep.ok, (rep.error, rep.journal)
    waits = [line for line in said if line.startswith("waiting for the fleet restart lock, etcd")]
    assert waits and "no etcd member answers" in waits[0]
    assert collect(ops, 1).healthy


# The prefill's graceful stop waits for a request whose decode leg never comes until its
# bootstrap timeout ends it, 300 simulated seconds (15 s at FAST_SIM_ENV's time scale):
# longer than a new decode takes to come up. The decode's heartbeat (every 20 s here, dropped
# after two misses) never sees the prefill's swap, as SGLang's 5 s do not on a host where the
# new prefill answers within a second or two of the old one's exit.
SLOW_STOP = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "300",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "400",
}


@pytest.fixture
def busy_pair(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> tuple[Ops, LocalUnits]:
    prefill = sim_factory("prefill", env=SLOW_STOP)
    decode = sim_factory("decode", env={**SLOW_STOP, **partner_env(prefill)})
    prefill.wait_healthy()
    decode.wait_healthy()
    gw = gateway_factory([], [], "--policy", "round_robin")
    # A drain window shorter than the held request: the stop meets a prefill that still holds
    # it, as on a host whose decode died (the drain waits for the engines' own count).
    timeouts = Timeouts(health=60, canary=8, poll=0.2, drain=0.5)
    ops, units = local_ops([LocalPair("pd0", prefill, decode)], gw, timeouts)
    (pair,) = ops.source.pairs()
    register_pair(ops, pair)
    gw.wait_ready()
    ops.say = lambda line: print(line, file=sys.stderr)
    return ops, units


@pytest.mark.parametrize("stop", ["target and engines", "target alone"])
def test_a_decode_killed_while_its_prefill_is_busy_is_recovered_by_a_stop_that_waits(
    busy_pair: tuple[Ops, LocalUnits], monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """Issue 19's power-off rehearsal, on one host: a decode killed while its prefill holds a
    request, and the pd-exporter's canaries going on. The restart's stop must wait for the
    old prefill: with `systemctl stop TARGET` alone (what it did) systemctl returns while the
    prefill is still in its graceful stop, the new decode comes up beside it, a canary makes
    it register with the old prefill's bootstrap server, and the new prefill never hears of
    it: every transfer fails ("KV transfer failed") until both restart again."""
    ops, units = busy_pair
    (pair,) = ops.source.pairs()
    (prefill,), (decode,) = pair.prefills, pair.decodes
    port = prefill.bootstrap_port or 0
    if stop == "target alone":
        # The control: a stop that does not wait for the engines, and a recovery that leaves
        # the held request alone (it ends it since, so the stop finds nothing to wait for).
        monkeypatch.setattr(restart, "_stop_here", lambda sd, target, units: sd.stop(target))
        monkeypatch.setattr(restart, "abort_held", lambda ops, pair, urls: None)
    body = {
        "text": "held",
        "sampling_params": {"max_new_tokens": 1},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": port,
        "bootstrap_room": 424242,
    }
    held = threading.Thread(
        target=lambda: requests.post(f"{prefill.url}/generate", json=body, timeout=60),
        daemon=True,
    )
    held.start()  # the prefill leg of a request whose decode leg never comes
    time.sleep(0.5)
    units.procs[decode.unit].kill()  # kill -9
    done = threading.Event()

    def exporter() -> None:
        while not done.is_set():
            pair_canary(prefill.url, decode.url, port, 1, timeout=2)
            done.wait(0.2)

    canaries = threading.Thread(target=exporter, daemon=True)
    canaries.start()
    try:
        rep = restart_pair(ops, pair, planned=False)
    finally:
        done.set()
        canaries.join(10)
    if stop == "target alone":
        assert not rep.ok and (rep.error or "").startswith("canary: no request passed in 8s")
        assert "KV transfer failed" in "\n".join(rep.journal[prefill.unit])
        return
    assert rep.ok, (rep.error, rep.journal)
    assert units.show(prefill.unit).active == "active"


def _die_after(ops: Ops, pair: Pair, phase: str) -> None:
    """A restarter that took the fleet lock, worked on `pair` up to `phase` and died: its
    lease ends (as after its ttl) and its phase record stays."""
    assert ops.fleet_lock is not None
    store = ops.fleet_lock.store
    grant = ops.fleet_lock.acquire(f"pdctl restart --both {pair.id}", [pair.id])
    assert isinstance(grant, Grant)
    phases = Phases(store, grant.lease, f"pdctl restart --both {pair.id}")
    assert phases.enter(pair.id, "drain")
    ops.gateways[0].remove([i.url for i in pair.instances])
    if phase == "stop":
        assert phases.enter(pair.id, "stop")
        stop_pair(ops, pair)
    store.revoke(grant.lease)
    assert not phases.enter(pair.id, "start")  # fenced: the lock is not its own any more


@pytest.mark.parametrize("phase", ["drain", "stop"])
def test_an_abandoned_restart_is_shown_then_finished_or_undone(
    two_pairs: tuple[Ops, LocalUnits], phase: str
) -> None:
    """Died draining: undone (its engines never stopped, so the same processes are registered
    again). Died after the stop: finished (started, checked, registered)."""
    ops, units = two_pairs
    pd0 = ops.source.pairs()[0]
    before = {i.unit: units.show(i.unit).main_pid for i in pd0.instances}
    _die_after(ops, pd0, phase)
    s = collect(ops, 1)
    (left,) = [p for p in s.pairs if p.abandoned]
    assert left.id == pd0.id and not s.healthy
    assert f"abandoned restart of {pd0.id} at phase {phase} by {socket.gethostname()}" in (
        left.abandoned or ""
    )
    assert finish.found(ops, host="elsewhere") == []  # another host's timer leaves it
    (rep,) = finish.finish(ops, None, lock_wait=10)
    assert rep.ok, (rep.error, rep.journal)
    after = {i.unit: units.show(i.unit).main_pid for i in pd0.instances}
    assert (after == before) is (phase == "drain")
    s = collect(ops, 1)
    assert s.healthy and {p.gateway for p in s.pairs} == {"routed"}
    assert finish.found(ops, None) == [] and finish.finish(ops, None, lock_wait=10) == []
    assert ops.fleet_lock is not None
    assert History(ops.fleet_lock.store).records(1)[0].targets == [pd0.id]
