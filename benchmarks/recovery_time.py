"""Crash recovery under the coordination store's faults (issue 19): from `kill -9` of a decode
to its pair serving again, against the pair's own start-up, and failed requests under
streaming load during each fault (docs/etcd.md).

Needs a three-host test fleet converged with deploy/profiles/sim-fleet.yml (`make demo-fleet`,
docs/testhost.md "Fleets"): it cuts hosts off the fleet's bridge (`ip link set vb-HOST`) and
powers host 1 off for good (`testhost down`), so run it on a fleet of its own. In order:
- `startup`: `pdctl restart --both` of an idle pair from the controller, --kills times; the
  pair's start-up is its restart's start + health + canary phases (`pdctl history`).
- `all-up`: a decode killed (`kill -9` of its MainPID) --kills times, pairs of hosts 2 and 3.
- `no-quorum`: hosts 1 and 3 cut off: a restart must refuse (exit 5); a decode killed on
  host 2 has its pair contained (out of gateway 2, prefill stopped); then the hosts are put
  back: the time until the pair serves again (goal: within a minute). --kills times.
- `paused-holder`: a restart on host 1 paused with SIGSTOP past the lock's ttl; the
  controller's restart takes the lock; the paused one, resumed, must stop (exit 1); then its
  pair is restarted back. --kills times.
- `host-1-lost`: host 1 (an etcd member, gateway 1, monitoring) powered off, then as all-up.
Every fault runs under constant streaming load through gateway 2 (the one that survives them
all), failures counted by pdctl's rule (pdctl/bench/stream.py); a sampler polls gateway 2's
/workers (benchmarks/fleet_roll.py): a pair serves when both its engines are held healthy and
ready there, which a recovery allows only after its canary. `pdctl recover` restarts a pair
at most 3 times an hour: with --kills 3, one run of every fault kills each pair of hosts 2 and
3 at most 3 times; run it on a fresh fleet, or an hour after the last.

    .venv/bin/python benchmarks/recovery_time.py -i deploy/testhost/state/pdfleet/inventory.ini \\
        -p deploy/profiles/sim-fleet.yml --api-key-file deploy/testhost/state/demo-api-key
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from fleet_roll import ROOT, Capacity, sample

from pdctl import names
from pdctl.coord.history import History
from pdctl.coord.lock import Holder, RestartLock
from pdctl.coord.store import Store, StoreUnavailable
from pdctl.ops.gateway import GatewayAdmin, GatewayError
from pdctl.ops.source import controller_topology
from pdctl.ops.systemd import SSH
from pdctl.spec import load_deployment
from pdctl.testing.stack import Outcome, T, constant_load, wait_until

FAULTS = ("startup", "all-up", "no-quorum", "paused-holder", "host-1-lost")
STARTUP_PHASES = ("start", "health", "canary")  # from `systemctl start` to healthy + canary
RECOVERY_TIMEOUT_S = 300.0
SETTLE_S = 3.0  # load after the pair serves again, so its late failures are counted


@dataclass
class Fleet:
    """The converged fleet as the controller reaches it."""

    inventory: Path
    profile: Path
    api_key: str
    ssh_config: Path
    hosts: list[str]  # host 1 first
    pairs: dict[str, list[str]]  # pair id -> its prefill and decode URLs
    gateway2: GatewayAdmin
    store: Store
    lock_ttl_s: float

    def ssh_argv(self, host: str, cmd: str) -> list[str]:
        return [*SSH, "-F", str(self.ssh_config), host, cmd]

    def ssh(self, host: str, cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.ssh_argv(host, cmd), capture_output=True, text=True, timeout=timeout
        )

    def ssh_ok(self, host: str, cmd: str) -> str:
        r = self.ssh(host, cmd)
        if r.returncode:
            raise SystemExit(f"{host}: `{cmd}` failed (exit {r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def reaches(self, host: str) -> bool:
        return self.ssh(host, "true").returncode == 0

    def pdctl(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`pdctl ARGS -i INVENTORY -p PROFILE` on the controller (hosts over ssh -F)."""
        env = dict(
            os.environ,
            PDCTL_SSH_CONFIG=str(self.ssh_config),
            PDSTACK_GATEWAY_API_KEY=self.api_key,
        )
        argv = [str(ROOT / ".venv/bin/pdctl"), *args, "-i", str(self.inventory)]
        return subprocess.run(
            [*argv, "-p", str(self.profile)], env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def kill_decode(self, pair: str) -> tuple[float, float]:
        """kill -9 of the pair's decode by its MainPID: (monotonic, wall) time of the kill."""
        host, name = pair.split("/")
        unit = names.engine_unit(name, "decode")
        pid = int(self.ssh_ok(host, f"systemctl show -p MainPID --value {unit}"))
        if not pid:
            raise SystemExit(f"{pair}: its decode {unit} has no main PID (not running)")
        t = time.monotonic(), time.time()
        self.ssh_ok(host, f"kill -9 {pid}")
        return t

    def holder(self, which: Callable[[Holder], bool] = lambda h: True) -> Holder | None:
        """The fleet restart lock's holder if it is `which` (None: free or etcd away)."""
        with contextlib.suppress(StoreUnavailable):
            h = RestartLock(self.store, self.lock_ttl_s).holder()
            return h if h and which(h) else None
        return None

    def startup_s(self, pair: str, since: float) -> float | None:
        """The pair's start-up in the first restart or recovery of it that began after `since`
        (wall clock) and succeeded: its start + health + canary phases, from the history."""
        for rec in reversed(History(self.store).records(limit=20)):
            phases = rec.phases.get(pair)
            if rec.started >= since - 1 and rec.result == "ok" and phases:
                return sum(phases.get(p, 0.0) for p in STARTUP_PHASES)
        return None

    def finished_startup_s(self, pair: str, since: float) -> float:
        """startup_s once the restart or recovery has written its record (a recovery
        registers the pair, so it serves, just before it does)."""
        got = wait(lambda: self.startup_s(pair, since), 60, f"the record of {pair}'s restart")
        return round(got, 1)


def load_fleet(inventory: Path, profile: Path, api_key: str) -> Fleet:
    dep = load_deployment(inventory, profile)
    topo = controller_topology(dep)
    if topo.coord is None or len(topo.coord.endpoints) != 3 or len(topo.gateways) < 2:
        raise SystemExit(
            "needs the three-host rehearsal: three etcd members and gateways on hosts 1 and 2 "
            "(testhost fleet-up --size 3, deploy/profiles/sim-fleet.yml)"
        )
    urls = {i.id: i.url for i in topo.instances}
    hosts = [g.host for g in topo.gateways[:2]]
    hosts += sorted({p.host for p in topo.pairs} - set(hosts))
    return Fleet(
        inventory=inventory,
        profile=profile,
        api_key=api_key,
        ssh_config=inventory.parent / "ssh_config",
        hosts=hosts,
        pairs={f"{p.host}/{p.name}": [urls[p.prefill], urls[p.decode]] for p in topo.pairs},
        gateway2=GatewayAdmin(topo.gateways[1].url, api_key),
        store=Store(topo.coord),
        lock_ttl_s=dep.profile.etcd.lock_ttl_s,
    )


@dataclass
class Row:
    fault: str
    recovered_s: list[float] = field(default_factory=list)  # kill (or quorum back) -> serving
    startup_s: list[float] = field(default_factory=list)  # the recovering pair's own start-up
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    per_kill_failed: list[int] = field(default_factory=list)  # from each kill to settled
    load: list[float] = field(default_factory=list)  # 1-minute load average, at each figure
    note: str = ""

    def figures(self) -> dict[str, object]:
        def spread(xs: list[float]) -> list[float] | None:
            return [min(xs), round(statistics.median(xs), 1), max(xs)] if xs else None

        return {
            "fault": self.fault,
            "runs": len(self.load),  # each run notes the load average once
            "serving_again_s_min_median_max": spread(self.recovered_s),
            "pair_startup_s_min_median_max": spread(self.startup_s),
            "requests": self.requests,
            "failed": len(self.failed),
            "failed_per_kill": self.per_kill_failed,
            "failures": self.failed[:5],
            "load_avg_1m_min_max": [min(self.load), max(self.load)] if self.load else None,
            "note": self.note,
        }


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Watch:
    """The load's outcomes so far and gateway 2's /workers samples (seconds since t0)."""

    outcomes: list[Outcome]
    cap: Capacity
    t0: float

    def served_again(self, pair: str, after: float) -> float | None:
        """Monotonic time the pair was routable again after being seen unroutable at or
        after `after`."""
        down = False
        for t, (routable,) in list(self.cap.samples):
            if self.t0 + t < after:
                continue
            if pair not in routable:
                down = True
            elif down:
                return self.t0 + t
        return None

    def failed_since(self, index: int) -> int:
        return sum(not o.ok for o in self.outcomes[index:])


@contextlib.contextmanager
def under_load(fleet: Fleet, row: Row, clients: int) -> Iterator[Watch]:
    """Streaming load through gateway 2 and its /workers sampled for the block; the row gets
    the requests and the failures."""
    stop = threading.Event()
    headers = {"Authorization": f"Bearer {fleet.api_key}"}
    try:
        with constant_load(fleet.gateway2.url, clients=clients, headers=headers) as outcomes:
            t0 = time.monotonic()  # sample()'s own start, within a millisecond
            watch = Watch(outcomes, sample([fleet.gateway2], fleet.pairs, stop), t0)
            time.sleep(SETTLE_S)
            yield watch
            time.sleep(SETTLE_S)
    finally:
        stop.set()
    row.requests = len(outcomes)
    row.failed = [o.failure or "" for o in outcomes if not o.ok]


def wait(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    return wait_until(pred, timeout, what, step=0.25)


def time_recovery(
    fleet: Fleet, watch: Watch, row: Row, pair: str, since: tuple[float, float], before: int
) -> None:
    """Until the pair serves again after `since` (monotonic, wall); the row gets the time, the
    load, the recovery's start-up and, once settled, the failures from request `before` on."""
    served = wait(
        lambda: watch.served_again(pair, since[0]),
        RECOVERY_TIMEOUT_S,
        f"{pair} serving again at gateway 2",
    )
    row.recovered_s.append(round(served - since[0], 1))
    row.load.append(loadavg())
    row.startup_s.append(fleet.finished_startup_s(pair, since[1]))
    time.sleep(SETTLE_S)
    row.per_kill_failed.append(watch.failed_since(before))
    print(f"  {row.fault}: {pair} serving {row.recovered_s[-1]}s (its start-up "
          f"{row.startup_s[-1]}s), load {row.load[-1]}", flush=True)  # fmt: skip


def kill_and_time(fleet: Fleet, watch: Watch, pair: str, row: Row) -> None:
    """One kill -9 of the pair's decode under the running load, until it serves again."""
    before = len(watch.outcomes)
    time_recovery(fleet, watch, row, pair, fleet.kill_decode(pair), before)


def kills(fleet: Fleet, row: Row, targets: list[str], n: int, clients: int) -> Row:
    with under_load(fleet, row, clients) as watch:
        for i in range(n):
            kill_and_time(fleet, watch, targets[i % len(targets)], row)
    return row


def startup(fleet: Fleet, pair: str, n: int) -> Row:
    row = Row("startup (idle pair, pdctl restart --both)")
    for _ in range(n):
        wall = time.time()
        r = fleet.pdctl("restart", "--both", "--pair", pair, "--yes")
        if r.returncode:
            raise SystemExit(f"pdctl restart --both --pair {pair} failed: {r.stderr[-2000:]}")
        row.startup_s.append(fleet.finished_startup_s(pair, wall))
        row.load.append(loadavg())
        print(f"  startup: {pair} {row.startup_s[-1]}s, load {row.load[-1]}", flush=True)
    return row


def cut(fleet: Fleet, hosts: list[str], up: bool) -> None:
    """The hosts' links to the fleet's bridge (test fleets: vb-HOST) down, or up again; back
    up, until ssh reaches each (a neighbour entry that failed meanwhile takes a while)."""
    for h in hosts:
        subprocess.run(["ip", "link", "set", f"vb-{h}", "up" if up else "down"], check=True)
    for h in hosts if up else ():
        wait(partial(fleet.reaches, h), 60, f"{h} back on the bridge")


def no_quorum(fleet: Fleet, pairs: list[str], n: int, clients: int) -> Row:
    row = Row("no quorum (hosts 1 and 3 cut off), from quorum back")
    row.note = "serving again: from the links back up (quorum back)"
    with under_load(fleet, row, clients) as watch:
        for i in range(n):
            no_quorum_once(fleet, watch, pairs[i % len(pairs)], row)
    return row


def no_quorum_once(fleet: Fleet, watch: Watch, pair: str, row: Row) -> None:
    """Hosts 1 and 3 cut off: a restart refuses; the pair's decode killed on host 2 is
    contained; hosts back: until the pair serves again."""
    host1, host2, host3 = fleet.hosts[:3]
    prefill = names.engine_unit(pair.split("/")[1], "prefill")
    urls = set(fleet.pairs[pair])
    before = len(watch.outcomes)
    cut(fleet, [host1, host3], up=False)
    try:
        other = next(p for p in fleet.pairs if p.startswith(f"{host2}/") and p != pair)
        refused = fleet.pdctl("restart", "--both", "--pair", other, "--yes", timeout=120)
        if refused.returncode != 5:
            raise SystemExit(
                f"a restart without quorum exited {refused.returncode}, not 5: "
                f"{refused.stderr.strip()[-500:]}"
            )
        fleet.kill_decode(pair)
        wait(
            lambda: (
                fleet.ssh_ok(host2, f"systemctl is-active {prefill} || true").strip() == "inactive"
                and not urls & {w.url for w in fleet.gateway2.workers()}
            ),
            90,
            f"{pair} contained (out of gateway 2, its prefill stopped)",
        )
    finally:
        back = time.monotonic(), time.time()  # the links up: quorum back (not when ssh is)
        cut(fleet, [host1, host3], up=True)
    time_recovery(fleet, watch, row, pair, back, before)


def paused_holder(fleet: Fleet, n: int, clients: int) -> Row:
    row = Row("lock holder paused past the ttl (SIGSTOP)")
    row.note = "the paused restart, resumed, stopped before its next step (exit 1)"
    with under_load(fleet, row, clients):
        for _ in range(n):
            paused_holder_once(fleet)
            row.load.append(loadavg())
            print(f"  paused holder: lock taken over, paused one stopped, load {row.load[-1]}")
    return row


def paused_holder_once(fleet: Fleet) -> None:
    """A restart on host 1 paused (SIGSTOP) once it holds the lock, past the ttl; the
    controller's restart takes the lock; the paused one, resumed meanwhile, must stop (exit 1).
    Then its pair, left out of the gateways, is restarted back."""
    host1, host2 = fleet.hosts[:2]
    paused_pair, other_pair = f"{host1}/pd1", f"{host2}/pd1"
    cmd = f"{names.VENV}/bin/pdctl restart --both --pair {paused_pair} --yes"
    argv = fleet.ssh_argv(host1, cmd)
    paused = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    held = wait(lambda: fleet.holder(lambda h: h.host == host1), 60, "host 1's restart's lock")
    fleet.ssh_ok(host1, f"kill -STOP {held.pid}")
    try:
        wait(lambda: not fleet.holder(), fleet.lock_ttl_s + 30, "the paused lease to end")
        with ThreadPoolExecutor(1) as pool:
            took = pool.submit(fleet.pdctl, "restart", "--both", "--pair", other_pair, "--yes")
            wait(
                lambda: fleet.holder(lambda h: h.pid != held.pid),
                60,
                "the controller's restart to take the lock",
            )
            fleet.ssh_ok(host1, f"kill -CONT {held.pid}")
            out, err = paused.communicate(timeout=300)
    finally:
        fleet.ssh(host1, f"kill -CONT {held.pid}")
    if took.result().returncode or paused.returncode != 1:
        raise SystemExit(
            f"expected the controller's restart ok (exit {took.result().returncode}) and the "
            f"paused one to stop (exit {paused.returncode}): {(out + err)[-1000:]}"
        )
    back = fleet.pdctl("restart", "--both", "--pair", paused_pair, "--yes")
    if back.returncode:
        raise SystemExit(f"restoring {paused_pair} failed: {back.stderr[-2000:]}")


def host_1_lost(fleet: Fleet) -> None:
    """Power host 1 off for good through the testhost tool (systemd poweroff, then by PID)."""
    host1 = fleet.hosts[0]
    tool = ROOT / "deploy/testhost/testhost"
    r = subprocess.run([str(tool), "down", "--name", host1], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"testhost down --name {host1} failed: {r.stderr[-2000:]}")
    gone = {u for p, urls in fleet.pairs.items() if p.startswith(f"{host1}/") for u in urls}

    def unhealthy() -> bool:
        with contextlib.suppress(GatewayError):
            return all(not w.healthy for w in fleet.gateway2.workers() if w.url in gone)
        return False

    wait(unhealthy, 60, "gateway 2 to mark host 1's engines unhealthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", type=Path, required=True)
    ap.add_argument("-p", "--profile", type=Path, required=True)
    ap.add_argument("--api-key-file", type=Path, required=True)
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"some of {','.join(FAULTS)}")
    ap.add_argument(
        "--kills", type=int, default=3, help="runs of each fault (kills, idle restarts)"
    )
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    faults = a.faults.split(",")
    if unknown := set(faults) - set(FAULTS):
        ap.error(f"unknown fault {', '.join(sorted(unknown))}: give some of {', '.join(FAULTS)}")
    fleet = load_fleet(a.inventory, a.profile.resolve(), a.api_key_file.read_text().strip())
    host2, host3 = fleet.hosts[1:3]
    # Pairs of hosts 2 and 3 in turn (they stay up when host 1 is lost), each kill the next
    # pair: a pair is recovered at most 3 times an hour (`pdctl recover --max-recoveries`),
    # and one run of every fault kills each of them at most 3 times.
    targets = [f"{h}/{p}" for p in ("pd1", "pd0") for h in (host3, host2)]
    lost_targets = targets[a.kills :] + targets[: a.kills] if "all-up" in faults else targets
    rows: list[Row] = []
    for f in FAULTS:  # in this order: host 1 lost is for good
        if f not in faults:
            continue
        print(f"{f}: load average {loadavg()}", flush=True)
        if f == "startup":
            rows.append(startup(fleet, f"{host2}/pd1", a.kills))
        elif f == "all-up":
            rows.append(kills(fleet, Row("kill -9, all hosts up"), targets, a.kills, a.clients))
        elif f == "no-quorum":
            rows.append(no_quorum(fleet, [f"{host2}/pd0", f"{host2}/pd1"], a.kills, a.clients))
        elif f == "paused-holder":
            rows.append(paused_holder(fleet, a.kills, a.clients))
        else:
            host_1_lost(fleet)
            row = Row("kill -9, host 1 powered off")
            rows.append(kills(fleet, row, lost_targets, a.kills, a.clients))
    result = [r.figures() for r in rows]
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for fig in result:
        print(json.dumps(fig))


if __name__ == "__main__":
    main()
