"""pdctl rollout over fake hosts (tests/unit/ops_fakes.py) and a real etcd (the session's,
tests/conftest.py): waves, the gate's rollback, the record's conditional writes, pause, resume
after the controller died, undo, and the refusals that change nothing."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pdctl import topology
from pdctl.coord.lock import Grant, RestartLock
from pdctl.coord.store import Store
from pdctl.errors import PdctlError
from pdctl.ops import gate, lock, release
from pdctl.ops import rollout as ro
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe
from pdctl.ops.release import Release
from pdctl.ops.rollout_state import Controller, Record, RecordChanged, Records, RolloutRunning
from pdctl.ops.source import Source
from pdctl.spec.profile import Rollout
from pdctl.testing.etcd import LOCK_TTL_S
from pdctl.topology import TopologyCoord
from tests.conftest import one_pair_topology, run_pdctl
from tests.unit.ops_fakes import FakeEngines, FakeSystemd, Listing, fake_ops, topo

GOOD = Release(env="/opt/pdstack/envs/sglang-good")
BAD = Release(env="/opt/pdstack/envs/sglang-slow")
HOSTS = ("node-a", "node-b")
GROUPS = ["node-a/pd0", "node-a/pd1", "node-b/pd0", "node-b/pd1"]
LIMITS = Rollout(soak_s=1, min_requests=10)
ITL_S = {GOOD.env: 0.010, BAD.env: 0.015}  # what each environment's engines do: 1.5x


@dataclasses.dataclass
class Fleet:
    ops: Ops
    hosts: dict[str, FakeSystemd]
    store: Store
    settings: ro.Settings
    held: ro.Held
    said: list[str]

    def query(self, _url: str | None) -> gate.Query:
        """Prometheus as the fleet would answer it: each group's ITL p90 is its release's
        (the unit's defaults: 10 ms), 500 requests each, none failed."""

        decodes = {p.id: p.decodes[0] for p in self.ops.source.pairs()}

        def itl(gid: str) -> float:
            r = release.read(self.ops, decodes[gid])
            return 0.010 if r is None else ITL_S[r.env]

        def answer(expr: str) -> dict[str, float]:
            groups = [g for g in GROUPS if g.replace("-", "\\\\-") in expr]
            if "inter_token_latency" in expr:
                values = {g: itl(g) for g in groups}
            elif "time_to_first_token" in expr:
                values = {g: 0.2 for g in groups}
            elif "num_requests_total" in expr:
                values = {g: 500.0 for g in groups}
            else:
                return {}  # no failure series at all
            if "by (pair)" in expr or "le, pair" in expr:
                return values
            return {"": max(values.values()) if "quantile" in expr else sum(values.values())}

        return answer

    def jobs(self, host: str) -> list[tuple[str, tuple[str, ...]]]:
        return [j for j in self.hosts[host].jobs if j[0] != "reset-failed"]


@pytest.fixture
def fleet(etcd_coord: TopologyCoord, tmp_path: Path) -> Fleet:
    hosts = {h: FakeSystemd() for h in HOSTS}
    for h, sd in hosts.items():
        sd.host = h
        for r in (GOOD, BAD):
            sd.files[f"{r.env}/pyvenv.cfg"] = "home = /usr/bin\n"
    said: list[str] = []
    t = topo(HOSTS)
    every = Source(t, None).pairs()
    routed = [GatewayWorker(i.url, i.url, i.role.value, "ready", True, 0, p.id)
              for p in every for i in p.instances]  # fmt: skip
    ops = dataclasses.replace(
        fake_ops(FakeSystemd(), Listing(held=routed), t=t),
        systemd_for=hosts.__getitem__,
        say=said.append,
    )
    store = Store(etcd_coord)
    fleet_lock = RestartLock(store, LOCK_TTL_S)

    def held(what: str, targets: list[str]):  # type: ignore[no-untyped-def]
        return lock.held(what, tmp_path / "restart.lock", 0, said.append, 0.01, fleet_lock)

    settings = ro.Settings(ttl_s=LOCK_TTL_S, soak_poll_s=0.05)
    return Fleet(ops, hosts, store, settings, held, said)


def _start(f: Fleet, target: Release = GOOD, k: str = "2", limits: Rollout = LIMITS) -> Record:
    req = ro.Request(target, k, False, "http://prom:9090", limits)
    return ro.start(f.ops, f.store, f.ops.source.pairs(), req, f.settings, f.query, f.held)


def _record(f: Fleet) -> Record:
    rec = Records(f.store).read()
    assert rec is not None
    return rec


def _dropins(f: Fleet, host: str) -> dict[str, str]:
    return {p: t for p, t in f.hosts[host].files.items() if p.endswith(release.DROPIN)}


def test_a_good_release_rolls_wave_by_wave_and_each_group_runs_it(fleet: Fleet) -> None:
    rec = _start(fleet)
    assert rec.state == "done"
    assert [w.groups for w in rec.waves] == [GROUPS[:2], GROUPS[2:]]  # K=2, host by host
    assert [w.state for w in rec.waves] == ["passed", "passed"]
    assert all(g.before is None and g.now == GOOD for g in rec.groups.values())
    for host in HOSTS:
        files = _dropins(fleet, host)
        assert len(files) == 4  # each engine unit of its two groups
        assert all(f"Environment=PDSTACK_ENV={GOOD.env}" in t for t in files.values())
        assert ("daemon-reload", ()) in fleet.jobs(host)
    # the last wave had no old group left: it was judged against the baseline
    assert rec.baseline is not None and rec.waves[1].old == rec.baseline
    assert _record(fleet).state == "done"


def test_a_slower_release_is_caught_at_the_first_gate_and_rolled_back(fleet: Fleet) -> None:
    with pytest.raises(ro.RolloutFailed) as e:
        _start(fleet, BAD)
    assert e.value.exit_code == 7
    msg = str(e.value)
    assert "wave 1 of 2 (node-a/pd0, node-a/pd1): gate failed: itl p90: node-a/pd0 15.0 ms" in msg
    assert "vs old 10.0 ms (1.50x, limit 1.2x)" in msg and "rolled back to the unit's" in msg
    assert _dropins(fleet, "node-a") == {}  # back to the units' own defaults
    # node-a's groups restarted twice (switch, rollback; K=2: each pair at once, in either
    # order); node-b's never touched
    starts = [j[1][0] for j in fleet.jobs("node-a") if j[0] == "start"]
    both = ["pdstack-pd0.target", "pdstack-pd1.target"]
    assert sorted(starts[:2]) == both and sorted(starts[2:]) == both
    assert fleet.jobs("node-b") == []
    rec = _record(fleet)
    assert (rec.state, rec.waves[0].state, rec.waves[1].state) == (
        "failed",
        "rolled back",
        "pending",
    )
    assert rec.waves[0].new["node-a/pd0"].itl_p90_s == 0.015
    assert all(g.now is None for g in rec.groups.values())


def test_a_rollout_started_while_another_is_live_changes_nothing(fleet: Fleet) -> None:
    with pytest.raises(ro.RolloutFailed):
        _start(fleet, BAD)
    revision = fleet.store.get("rollouts/current")
    with pytest.raises(ro.NothingToDo, match=r"^rollout r-\w+ to .*sglang-slow is failed \(0 of 2"):
        _start(fleet, GOOD)
    assert fleet.store.get("rollouts/current") == revision
    # with a controller driving one, a second is refused before it reads anything
    with Controller(fleet.store, LOCK_TTL_S), pytest.raises(RolloutRunning, match="is running"):
        _start(fleet, GOOD)


def test_nothing_to_resume_undo_or_pause_and_an_unknown_target_are_one_line(
    fleet: Fleet,
) -> None:
    for call in (
        lambda: ro.resume(fleet.ops, fleet.store, fleet.settings, fleet.query, fleet.held),
        lambda: ro.undo(fleet.ops, fleet.store, fleet.settings, fleet.held),
        lambda: ro.pause(fleet.store),
    ):
        with pytest.raises(ro.NothingToDo, match=r"^nothing to \w+: no rollout") as e:
            call()
        assert "\n" not in str(e.value) and e.value.exit_code == 2
    with pytest.raises(PdctlError, match=r"^unknown target /opt/x: node-a has no /opt/x/pyvenv"):
        _start(fleet, Release(env="/opt/x"))
    assert fleet.store.get("rollouts/current") is None
    assert all(_dropins(fleet, h) == {} and fleet.jobs(h) == [] for h in HOSTS)


def test_undo_takes_the_last_wave_back_first(fleet: Fleet) -> None:
    _start(fleet)
    fleet.hosts["node-a"].jobs.clear()
    fleet.hosts["node-b"].jobs.clear()
    order: list[str] = []
    restart_of = ro.restart.roll_held

    def recorded(ops, chosen, b, held, what):  # type: ignore[no-untyped-def]
        order.extend(p.id for p in chosen)
        return restart_of(ops, chosen, b, held, what)

    ro.restart.roll_held = recorded  # type: ignore[assignment]
    try:
        rec = ro.undo(fleet.ops, fleet.store, fleet.settings, fleet.held)
    finally:
        ro.restart.roll_held = restart_of  # type: ignore[assignment]
    assert order == GROUPS[2:] + GROUPS[:2]
    assert rec.state == "undone" and all(g.now is None for g in rec.groups.values())
    assert all(_dropins(fleet, h) == {} for h in HOSTS)
    with pytest.raises(ro.NothingToDo, match=r"nothing to undo: rollout r-\w+ is undone"):
        ro.undo(fleet.ops, fleet.store, fleet.settings, fleet.held)


def test_undo_order_skips_groups_already_on_their_release_before(fleet: Fleet) -> None:
    with pytest.raises(ro.RolloutFailed):
        _start(fleet, BAD)
    rec = _record(fleet)
    assert ro.undo_order(rec) == []
    rec.groups["node-b/pd1"].now = GOOD
    rec.groups["node-a/pd0"].now = GOOD
    assert ro.undo_order(rec) == [["node-b/pd1"], ["node-a/pd0"]]


def test_a_write_over_a_record_another_wrote_since_is_refused(fleet: Fleet) -> None:
    mine, theirs = Records(fleet.store), Records(fleet.store)
    assert mine.read() is None and theirs.read() is None
    with pytest.raises(ro.RolloutFailed):
        _start(fleet, BAD)  # wrote the key after both read "none"
    rec = _record(fleet)
    with pytest.raises(RecordChanged, match=r"changed under this controller: .* wrote it \(failed"):
        mine.write(rec)
    current = Records(fleet.store)
    current.read()
    current.write(rec)  # at the revision it read: taken


def _until(ok: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_pause_stops_a_soaking_wave_and_resume_soaks_it_again(fleet: Fleet) -> None:
    got: list[Record | BaseException] = []

    def run() -> None:
        try:
            got.append(_start(fleet, GOOD, "2", Rollout(soak_s=2, min_requests=10)))
        except BaseException as e:  # the assertion below shows it
            got.append(e)

    def soaking() -> bool:
        r = Records(fleet.store).read()
        return r is not None and r.waves[0].state == "soaking"

    t = threading.Thread(target=run)
    t.start()
    _until(soaking)
    assert ro.pause(fleet.store).endswith("its controller pauses before its next step")
    t.join(10)
    rec = got[0]
    assert isinstance(rec, Record), rec
    assert (rec.state, rec.waves[0].state) == ("paused", "soaking")
    assert fleet.jobs("node-b") == []
    with pytest.raises(ro.NothingToDo, match=r"nothing to pause: rollout r-\w+ is paused"):
        ro.pause(fleet.store)
    done = ro.resume(fleet.ops, fleet.store, fleet.settings, fleet.query, fleet.held)
    assert done.state == "done" and [w.state for w in done.waves] == ["passed", "passed"]
    starts = [j for j in fleet.jobs("node-a") if j[0] == "start"]
    assert len(starts) == 2  # wave 1 soaked again; it did not restart again


DIES = """
import sys, time
from pdctl.coord.store import Store
from pdctl.ops.rollout_state import Controller, Record, Records
from pdctl.topology import TopologyCoord
store = Store(TopologyCoord.model_validate_json(sys.argv[1]))
with Controller(store, float(sys.argv[3])):
    records = Records(store)
    records.read()
    records.write(Record.model_validate_json(sys.argv[2]))
    print("driving", flush=True)
    time.sleep(600)
"""


def test_a_rollout_whose_controller_died_is_resumed_from_its_record(
    fleet: Fleet, etcd_coord: TopologyCoord
) -> None:
    """A controller that wrote wave 1 as soaking and was killed (SIGKILL: its key stays
    until its lease runs out); resume elsewhere is refused while it may live, then takes
    over: wave 1 soaks and is gated again, wave 2 rolls."""
    with pytest.raises(ro.RolloutFailed):  # a record to start from: node-a's groups out
        _start(fleet, BAD)
    rec = _record(fleet)
    rec.target, rec.state = GOOD, "running"
    rec.waves[0].state = "soaking"
    for g in rec.waves[0].groups:
        rec.groups[g].now = GOOD
    for p in fleet.ops.source.pairs()[:2]:
        release.write(fleet.ops, p, GOOD)
    proc = subprocess.Popen(
        [sys.executable, "-c", DIES, etcd_coord.model_dump_json(), rec.model_dump_json(), "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "driving\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(RolloutRunning, match=r"a rollout is running: .* PID"):
            ro.resume(fleet.ops, fleet.store, fleet.settings, fleet.query, fleet.held)
        time.sleep(LOCK_TTL_S + 1.5)  # its lease runs out
        done = ro.resume(fleet.ops, fleet.store, fleet.settings, fleet.query, fleet.held)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done.state == "done"
    assert all(g.now == GOOD for g in done.groups.values())
    assert [j for j in fleet.jobs("node-b") if j[0] == "start"]  # wave 2 rolled


def test_a_wave_refused_the_restart_lock_leaves_no_drop_in_and_resumes(fleet: Fleet) -> None:
    """Another restart holds the fleet lock past --lock-wait: nothing restarted, and the
    drop-ins say again what runs (a recovery meanwhile must not start the new release)."""
    other = RestartLock(fleet.store, LOCK_TTL_S)
    grant = other.acquire("pdctl restart --both --pair node-a/pd0")
    assert isinstance(grant, Grant)
    try:
        with pytest.raises(lock.LockHeld) as e:
            _start(fleet)
    finally:
        other.release(grant)
    assert e.value.exit_code == 3
    assert all(_dropins(fleet, h) == {} for h in HOSTS)
    assert [j for h in HOSTS for j in fleet.jobs(h) if j[0] != "daemon-reload"] == []
    rec = _record(fleet)
    assert (rec.state, rec.waves[0].state) == ("running", "switching")
    done = ro.resume(fleet.ops, fleet.store, fleet.settings, fleet.query, fleet.held)
    assert done.state == "done" and all(g.now == GOOD for g in done.groups.values())


def test_a_wave_whose_restart_fails_comes_back_on_the_old_release(fleet: Fleet) -> None:
    """Engines of the bad release never turn healthy: the wave's restart fails, and the
    rollback restarts its groups (the failed ones included) on the release before."""
    by_url = {i.url: i for i in fleet.ops.source.topology.instances}

    def probe(url: str) -> EngineProbe:
        r = release.read(fleet.ops, by_url[url])
        return EngineProbe(url, "503" if r == BAD else "ok")

    fleet.ops.engines = FakeEngines(probe_of=probe)
    # K=2: both groups restart at once and either may be the first to fail
    with pytest.raises(ro.RolloutFailed, match=r"wave 1 of 2 .*: restart failed: node-a/pd[01]: "):
        _start(fleet, BAD)
    rec = _record(fleet)
    assert all(g.now is None for g in rec.groups.values())
    assert "rolled back to the unit's defaults" in (rec.message or "")
    starts = [j[1][0] for j in fleet.jobs("node-a") if j[0] == "start"]
    assert sorted(starts[-2:]) == ["pdstack-pd0.target", "pdstack-pd1.target"]  # rollback
    assert fleet.jobs("node-b") == []


def test_the_commands_show_the_record_and_refuse_in_one_line(
    fleet: Fleet, etcd_coord: TopologyCoord, tmp_path: Path
) -> None:
    topo_file = tmp_path / "topology.yaml"
    url = "http://127.0.0.1:9"
    t = one_pair_topology(
        "node-a", url, url, bootstrap_port=1, gateway_url=url, metrics_url=url + "/metrics"
    )
    topo_file.write_text(topology.dump(t.model_copy(update={"coord": etcd_coord})))
    where = ("--topology", str(topo_file))
    assert run_pdctl("rollout", "status", *where).stdout == "no rollout\n"
    undo = "no rollout, and no group runs another release than it ran before"
    for verb, why in (("pause", "no rollout"), ("resume", "no rollout"), ("undo", undo)):
        refused = run_pdctl("rollout", verb, *where)
        assert refused.exit_code == 2
        assert refused.stderr == f"Error: nothing to {verb}: {why}; nothing was changed\n"
    with pytest.raises(ro.RolloutFailed):
        _start(fleet, BAD)
    shown = json.loads(run_pdctl("rollout", "status", "--format", "json", *where).stdout)
    assert shown["controller"] is None
    assert shown["rollout"]["state"] == "failed"
    assert shown["rollout"]["waves"][0]["verdict"][0].startswith("itl p90: node-a/pd0 15.0 ms")
    table = run_pdctl("rollout", "status", *where).stdout.splitlines()
    assert table[0].startswith("rollout r-")
    assert ": failed, to /opt/pdstack/envs/sglang-slow, started " in table[0]
    assert "  wave 1: rolled back: node-a/pd0, node-a/pd1" in table
    assert "  node-a/pd0: now the unit's defaults (before: the unit's defaults)" in table
