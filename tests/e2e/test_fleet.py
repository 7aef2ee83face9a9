"""site.yml over a fleet: three test hosts on one bridge, one inventory, deploy/profiles/
sim-fleet.yml (two pairs per host on two pretend NUMA nodes, a gateway on hosts 1 and 2, an
etcd member of the coordination store on every host).

In file order: the first converge, requests through the first host's gateway served by every
pair of every host, `pdctl status` of the whole fleet from the controller, every store member
healthy over TLS from the controller; then restarts across the fleet: a config change rolled
under load two groups at a time over all hosts (one roll from the controller) with no failed
request and the floor held (the second run: only the engine units and the roll change in it;
a third run changes nothing), the fleet
restart lock (a lease in etcd) refusing a second restarter (the controller) while a host
restarts, naming the holder, a pair whose prefill and decode are on different hosts (KV
through NIXL between them), and last the second host cut off the bridge
in the middle of a roll (site.yml fails naming it; its lease ends with its renewals, and its
gateway's liveness key with them, so a restart on host 1 goes on without that gateway, naming
it, with no failed request through gateway 1; host 2's drained pair stays visible; on host 2
the minority member refuses a restart and a crashed pair is contained), then put back: both
of host 2's pairs serve again with no operator step. Then the store's faults: hosts 1 and
3 cut off (no quorum: a restart refuses in one line, a decode killed on host 2 has its pair
taken out of gateway 2 and its prefill stopped while the recovery waits, then recovered once
quorum is back), a restart paused with SIGSTOP past the ttl (the controller's restart
takes the lock; the paused one, resumed, stops before its next step), and last host 1 powered
off (a restart from the controller goes on without its gateway, and a decode killed on host 3
under streaming load through gateway 2 is recovered automatically at the first try).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml
from fixtures_site import (
    API_KEY,
    CLIENTS,
    CONVERGE_TIMEOUT,
    PDCTL,
    ROOT,
    Run,
    Site,
    build_wheelhouse,
    host_status,
    roll_under_load,
    site_load,
    wait_ready,
    write_profile,
)

from pdctl import names
from pdctl.errors import PdctlError
from pdctl.ops.gateway import GatewayAdmin
from pdctl.pdclient import pair_canary
from pdctl.spec.load import load_profile
from pdctl.testing.stack import flowed, wait_until

if TYPE_CHECKING:
    from conftest import TestFleet, TestHost

# A converge of two hosts, or a roll of four pairs and a second run, takes 5-11 minutes on a
# loaded 2-core machine: the e2e default (15 minutes) leaves too little margin.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

FLEET_PROFILE = ROOT / "deploy" / "profiles" / "sim-fleet.yml"
LOCK_TTL_S = load_profile(FLEET_PROFILE).etcd.lock_ttl_s
PAIRS_PER_HOST = 2
FLEET_SIZE = 3  # conftest's fleet fixture: three etcd members, gateways on hosts 1 and 2
REQUESTS_PER_PAIR = 2
PROBES = ("/metrics", "/health", "/health_generate")
PAIRS = ("pd0", "pd1")


@pytest.fixture(scope="module")
def fleet_site(fleet: TestFleet) -> Iterator[Site]:
    print(f"fleet-up: {fleet.seconds:.0f}s")
    wheelhouse = build_wheelhouse(FLEET_PROFILE, fleet.inventory)
    yield Site(fleet, wheelhouse, FLEET_PROFILE, finish_interval_s=30)


def _served(url: str) -> float:
    """Requests an engine served, probes and scrapes apart (the fleet's inventory lets the
    controller through the engine firewall)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r'sglang:http_requests_total\{endpoint="([^"]+)"[^}]*\} (\S+)', line)
        if m and m.group(1) not in PROBES:
            total += float(m.group(2))
    return total


def test_fleet_converges(fleet_site: Site, fleet: TestFleet) -> None:
    run = fleet_site.run()
    run.assert_ok()
    assert sorted(run.recaps) == sorted(h.name for h in fleet.hosts)
    assert all(r["changed"] > 0 for r in run.recaps.values()), run.recaps
    print(f"converge: {run.seconds:.0f}s")


def test_first_gateway_routes_to_every_pair_on_every_host(fleet_site: Site) -> None:
    dep = fleet_site.deployment()
    first = dep["gateway"]["url"]
    wait_ready(first)
    instances = [i["inst"] for h in dep["hosts"].values() for i in h["instances"]]
    assert len({i["id"].split("/")[0] for i in instances}) == FLEET_SIZE
    assert len(instances) == FLEET_SIZE * PAIRS_PER_HOST * 2
    before = {i["url"]: _served(i["url"]) for i in instances}
    n_pairs = len(instances) // 2
    for n in range(n_pairs * REQUESTS_PER_PAIR):
        r = requests.post(
            f"{first}/v1/chat/completions",
            json={
                "model": "sim-model",
                "messages": [{"role": "user", "content": f"request {n}"}],
                "max_tokens": 8,
            },
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
    served = {i["id"]: _served(i["url"]) - before[i["url"]] for i in instances}
    # Round robin over equal counts: every prefill and every decode of every host served.
    assert all(v >= 1 for v in served.values()), served


def controller_pdctl(
    fleet: TestFleet, profile: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`pdctl ARGS -i INVENTORY -p PROFILE` on the controller (hosts over ssh -F)."""
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pdctl"), *args, *_controller_args(fleet, profile)],
        env=_controller_env(fleet),
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def _controller_env(fleet: TestFleet) -> dict[str, str]:
    return dict(
        os.environ,
        PDCTL_SSH_CONFIG=str(fleet.ssh_config),
        PDSTACK_GATEWAY_API_KEY=API_KEY,
        PYTHONPATH=str(ROOT),
    )


def _controller_args(fleet: TestFleet, profile: Path = FLEET_PROFILE) -> list[str]:
    return ["-i", str(fleet.inventory), "-p", str(profile)]


def test_pdctl_status_from_the_controller_shows_the_fleet(
    fleet_site: Site, fleet: TestFleet
) -> None:
    env = _controller_env(fleet)
    pdctl = [str(Path(ROOT / ".venv" / "bin" / "pdctl")), "status"]
    args = _controller_args(fleet)
    result = controller_pdctl(fleet, FLEET_PROFILE, "status", "--format", "json")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    status = json.loads(result.stdout)
    hosts = {h.name for h in fleet.hosts}
    assert {i["id"].split("/")[0] for i in status["instances"]} == hosts
    assert all(i["active"] == "active" and not i["unit_error"] for i in status["instances"])
    assert len(status["pairs"]) == PAIRS_PER_HOST * len(hosts)
    assert all(p["canary"]["ok"] and p["gateway"] == "routed" for p in status["pairs"])
    assert [g["ready"] for g in status["gateways"]] == [True, True]
    # The terminal view names every host (unit states come over ssh -F).
    table = subprocess.run(
        [*pdctl, *args], env={**env, "COLUMNS": "80"}, text=True, capture_output=True, timeout=120
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert "2 gateways" in table.stdout and all(h in table.stdout for h in hosts), table.stdout


def test_every_store_member_is_healthy_over_tls_from_the_controller(
    fleet_site: Site, fleet: TestFleet
) -> None:
    from pdctl.coord.health import MemberHealth, member_health
    from pdctl.ops.source import controller_topology
    from pdctl.spec import load_deployment

    coord = controller_topology(load_deployment(fleet.inventory, fleet_site.profile)).coord
    assert coord is not None and len(coord.endpoints) == FLEET_SIZE
    store = coord
    # etcd 3.4's /health is a quorum read bounded to a second: on the loaded 2-core machine a
    # member can miss one (the leader answered {"health":"false"} once in a fresh-clone run),
    # so the store must settle, every member healthy and one leader, not be so at one instant.
    seen: list[list[MemberHealth]] = []

    def settled() -> bool:
        members = member_health(store)
        seen.append(members)
        return all(m.healthy for m in members) and sum(bool(m.leader) for m in members) == 1

    try:
        wait_until(settled, 30, "every etcd member healthy under one leader", step=1)
    except TimeoutError:
        pytest.fail(f"the store did not settle within 30 s: {seen[-1]}")
    doctor = controller_pdctl(fleet, fleet_site.profile, "doctor", "--format", "json")
    assert "live-etcd" not in doctor.stdout, doctor.stdout[-3000:]


# ----- restarts across the fleet ------------------------------------------------------------


def _profile(path: Path, context_length: int) -> Path:
    """sim-fleet.yml with `engine.common.context_length` (a change every engine's unit sees)."""
    profile = yaml.safe_load(FLEET_PROFILE.read_text())
    profile["engine"]["common"]["context_length"] = context_length
    return write_profile(path, profile)


def _units(pairs: Iterable[str]) -> list[str]:
    return [names.engine_unit(p, r) for p in pairs for r in names.ROLES]


def main_pids(fleet: TestFleet) -> dict[str, int]:
    """MainPID of every engine of the fleet, by HOST/UNIT."""
    pids = {}
    for h in fleet.hosts:
        units = _units(PAIRS)
        out = h.ssh(f"systemctl show -p MainPID --value {' '.join(units)}", check=True).stdout
        pids.update({f"{h.name}/{u}": int(p) for u, p in zip(units, out.split(), strict=True)})
    return pids


def target_jobs(fleet: TestFleet, since: float) -> list[tuple[float, str, str]]:
    """(time, HOST/pair target, stop|start) of every finished systemd job on the pair targets
    of every host, in time order (the hosts share the controller's clock)."""
    filters = " ".join(f"UNIT={names.pair_target(p)}" for p in PAIRS)
    jobs = []
    for h in fleet.hosts:
        cmd = f"journalctl -o json --no-pager --since @{int(since)} {filters}"
        for line in h.ssh(cmd, check=True).stdout.splitlines():
            rec = json.loads(line)
            if rec.get("JOB_TYPE") in ("stop", "start") and rec.get("JOB_RESULT") == "done":
                t = int(rec["__REALTIME_TIMESTAMP"]) / 1e6
                jobs.append((t, f"{h.name}/{rec['UNIT']}", rec["JOB_TYPE"]))
    return sorted(jobs)


# The fleet rolls K groups at a time, fleet-wide (one pdctl restart for the play, from the
# controller); the single host's roll (test_site_roll.py) keeps K=1, one at a time.
ROLL_K = 2
# What a new context_length changes over the fleet: the engine units (their command lines),
# then the one roll of every host's changed pairs (from the controller).
ROLL_CHANGES = [
    "pdstack_engine : Write the engine units",
    "pdstack_engine : Roll the changed groups (drain, restart, canary, register)",
]


def groups_routed(dep: dict[str, Any]) -> int:
    """The fleet's groups that every gateway routes to (each member listed, not draining):
    the count the roll's floor keeps."""
    groups: dict[str, set[str]] = {}
    for host, spec in dep["hosts"].items():
        for i in spec["instances"]:
            groups.setdefault(f"{host}/{i['inst']['pair']}", set()).add(i["inst"]["url"])
    views = [gateway_urls(url) for url in dep["gateway"]["urls"].values()]
    return sum(all(urls <= v for v in views) for urls in groups.values())


def most_out(jobs: list[tuple[float, str, str]]) -> int:
    """The most pair targets between their stop and their start at once."""
    out = peak = 0
    for _, _, kind in jobs:
        out += 1 if kind == "stop" else -1
        peak = max(peak, out)
    return peak


def test_a_config_change_rolls_k_groups_at_a_time_across_the_fleet(
    fleet_site: Site, fleet: TestFleet, tmp_path: Path
) -> None:
    """pdstack_engine_roll_max_unavailable=2: one roll of the fleet's 6 groups with at most 2
    out at once over all hosts, the gateways routing at least 4 throughout (polled), no
    failed request; then a second run changes nothing.

    The roll is the fleet's second run: that only the engine units and the roll changed in it
    proves every other task idempotent after the first converge, and the run after it, with
    the same profile, that nothing changes at all."""
    before = main_pids(fleet)
    t0 = time.time() - 1
    dep = fleet_site.deployment()
    changed = _profile(tmp_path / "changed.yml", 4096)
    routed: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(PdctlError):
                routed.append(groups_routed(dep))
            time.sleep(0.2)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        run = roll_under_load(
            fleet_site, changed, "-e", f"pdstack_engine_roll_max_unavailable={ROLL_K}"
        )
    finally:
        done.set()
        watcher.join(10)
    changes = run.changed_tasks()
    assert changes == ROLL_CHANGES, f"{changes}\n{run.output[-4000:]}"
    after = main_pids(fleet)
    assert all(after[k] != v for k, v in before.items()), (before, after)
    groups = PAIRS_PER_HOST * FLEET_SIZE
    assert routed and min(routed) >= groups - ROLL_K, routed  # the floor, as the gateways see it
    # pdctl's progress: the groups out after each start and end; never more than K.
    outs = [
        [] if out == "none" else out.split(", ")
        for line in run.output.splitlines()
        if "roll: out " in line
        for out in [line.split("roll: out ", 1)[1].split(";", 1)[0]]
    ]
    assert outs and max(len(o) for o in outs) == ROLL_K, run.output[-6000:]
    hosts_out = max(len({g.split("/")[0] for g in o}) for o in outs)
    # Every pair target of every host stopped and started once, at most K down at once.
    jobs = target_jobs(fleet, t0)
    assert sorted(t for _, t, kind in jobs if kind == "stop") == sorted(
        f"{h.name}/{names.pair_target(p)}" for h in fleet.hosts for p in PAIRS
    ), jobs
    assert most_out(jobs) <= ROLL_K, jobs
    print(
        f"roll at K={ROLL_K}: fewest groups routed {min(routed)} of {groups}; "
        f"most hosts with a group out at once {hosts_out}"
    )
    again = fleet_site.run(profile=changed)
    again.assert_ok()
    changed_counts = {h: r["changed"] for h, r in again.recaps.items()}
    assert set(changed_counts.values()) == {0}, f"{changed_counts}: {again.changed_tasks()}"
    print(f"second run after the roll: {again.seconds:.0f}s")
    fleet_site.profile = changed  # the fleet runs it now: later tests change from here


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """pred()'s first true value, polled every 0.2 s for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def lease(host: TestHost) -> dict[str, Any] | None:
    """The fleet restart lock's holder (`pdctl lock show` on `host`, from etcd), None if free."""
    r = host.ssh(f"{PDCTL} lock show --format json", timeout=60)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    got: dict[str, Any] | None = shown["holder"] if shown["held"] else None
    return got


def serving(fleet: TestFleet, *pair_ids: str) -> bool:
    """The pairs are routed at the gateways and their canaries pass (host 1's `pdctl status`)."""
    pairs = {p["id"]: p for p in host_status(fleet.hosts[0])["pairs"]}
    return all(pairs[i]["gateway"] == "routed" and pairs[i]["canary"]["ok"] for i in pair_ids)


RELEASE = "/run/pdstack-test-release"


@contextlib.contextmanager
def start_held(host: TestHost, unit: str) -> Iterator[None]:
    """The unit's next start waits (a runtime drop-in's ExecStartPre) until the block ends: a
    restart of its pair holds the fleet lock until then, however slow the machine is."""
    dropin = f"/run/systemd/system/{unit}.d"
    conf = (
        "[Service]\nTimeoutStartSec=infinity\n"
        f"ExecStartPre=+/bin/sh -c 'until [ -e {RELEASE} ]; do sleep 0.2; done'\n"
    )
    made = host.ssh(
        f"rm -f {RELEASE} && mkdir -p {dropin} && cat > {dropin}/hold.conf"
        " && systemctl daemon-reload",
        input=conf,
    )
    assert made.returncode == 0, made.stderr
    try:
        yield
    finally:
        host.ssh(f"touch {RELEASE}", check=True)
        host.ssh(f"rm -rf {dropin} {RELEASE} && systemctl daemon-reload", check=True)


def test_the_fleet_lock_refuses_a_second_restarter_naming_the_first(
    fleet_site: Site, fleet: TestFleet
) -> None:
    first, second = fleet.hosts[:2]
    # Both pairs of the first host, under one lease: the first one's start waits until both
    # commands below have answered.
    mine = [f"{first.name}/{p}" for p in PAIRS]
    theirs = f"{second.name}/pd1"
    start = time.monotonic()
    pairs = " ".join(f"--pair {p}" for p in mine)
    with start_held(first, names.engine_unit(PAIRS[0], "prefill")):
        holder = _background(first, f"{PDCTL} restart --both {pairs} --yes")
        try:
            held = wait_for(lambda: lease(first), 60, "the first host's restart to take the lock")
            # From the controller, for a pair of the other host, not waiting; and its status.
            with ThreadPoolExecutor(2) as pool:
                refusing = pool.submit(
                    controller_pdctl, fleet, fleet_site.profile,
                    "restart", "--both", "--pair", theirs, "--yes", "--lock-wait", "0",
                )  # fmt: skip
                showing = pool.submit(
                    controller_pdctl, fleet, fleet_site.profile, "status", "--format", "json"
                )
                refused, status = refusing.result(), showing.result()
            assert holder.poll() is None, "the holder ended while its start was held"
        except BaseException:
            holder.kill()
            raise
    out, err = holder.communicate(timeout=600)
    assert holder.returncode == 0, out[-3000:] + err[-3000:]
    what = f"pdctl restart --both {' '.join(mine)}"
    assert held["host"] == first.name and held["command"] == what, held
    assert refused.returncode == 3, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert f"{first.name} PID {held['pid']} {what}" in refused.stderr, refused.stderr
    shown = json.loads(status.stdout)["restart_lock"]
    assert shown["held"] and shown["host"] == first.name, shown
    assert shown["pid"] == held["pid"] and shown["command"] == what, shown
    assert lease(first) is None
    assert serving(fleet, *mine, theirs)
    print(f"contended lock: {time.monotonic() - start:.0f}s")


# A pair whose prefill runs on one host and decode on the other (issue 14 item 4): transient
# units beside the fleet's engines, on ports no pair uses.
XHOST_PORTS = {"prefill": 31000, "decode": 31001}
XHOST_BOOTSTRAP = 31002


def _xhost_unit(role: str) -> str:
    return f"pdstack-xhost-{role}.service"


def _metric_count(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(f"{name}_count"))


def test_a_pair_across_two_hosts_moves_kv_through_nixl(fleet: TestFleet) -> None:
    start = time.monotonic()
    legs = dict(zip(names.ROLES, fleet.hosts, strict=False))
    urls = {role: f"http://{h.address}:{XHOST_PORTS[role]}" for role, h in legs.items()}
    try:
        for role, host in legs.items():
            argv = [
                f"{names.VENV}/bin/python", "-m", "pdctl.sim",
                "--model-path", "/opt/pdstack/models/sim", "--served-model-name", "sim-model",
                "--host", "0.0.0.0", "--port", str(XHOST_PORTS[role]),
                "--disaggregation-mode", role,
                "--disaggregation-bootstrap-port", str(XHOST_BOOTSTRAP),
                "--disaggregation-transfer-backend", "nixl", "--enable-metrics",
            ]  # fmt: skip
            run = host.ssh(
                f"systemd-run --unit={_xhost_unit(role)} --setenv=PDSIM_STARTUP_DELAY_S=0 "
                + " ".join(argv)
            )
            assert run.returncode == 0, run.stderr
        for role, url in urls.items():
            wait_until(
                lambda u=url: requests.get(f"{u}/health", timeout=2).status_code == 200,
                60,
                f"the cross-host {role} at {url}",
            )
        result = pair_canary(urls["prefill"], urls["decode"], XHOST_BOOTSTRAP, count=3, timeout=30)
        assert result.ok, result
        # The KV went through NIXL: the prefill's WRITEs to the decode's registered pool.
        assert _metric_count(urls["prefill"], "sglang:kv_transfer_speed_gb_s") >= 3
        logs = {
            role: host.ssh(f"journalctl -u {_xhost_unit(role)} --no-pager -o cat").stdout
            for role, host in legs.items()
        }
        assert all("NIXL KVManager initialized with backend: UCX" in t for t in logs.values()), logs
        assert "NIXL transport error" not in logs["prefill"], logs["prefill"][-3000:]
    finally:
        for role, host in legs.items():
            host.ssh(
                f"systemctl stop {_xhost_unit(role)}; systemctl reset-failed {_xhost_unit(role)}"
            )
    print(f"cross-host pair: {time.monotonic() - start:.0f}s")


def gateway_urls(gateway: str) -> set[str]:
    """URLs of the workers a gateway routes to (listed and not draining)."""
    workers = GatewayAdmin(gateway, API_KEY).workers()
    return {w.url for w in workers if w.status != "draining"}


def _inside(host: TestHost, command: str) -> subprocess.CompletedProcess[str]:
    """`command` on `host` through its namespaces (nsenter into its PID 1), not its network:
    it reaches a host cut off the bridge. A clean environment, as a login's."""
    argv = ["nsenter", "-t", str(host.leader_pid), "-a", "--", "env", "-i"]
    argv += ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "sh", "-c", command]
    return subprocess.run(argv, text=True, capture_output=True, timeout=300)


@contextlib.contextmanager
def _always_in_flight(prefill: str, decode: str, bootstrap_port: int) -> Iterator[None]:
    """Long requests sent straight to a pair (both legs, as the gateway sends them), two
    overlapping streams of them, until the block ends: the pair always holds one in flight,
    so a planned drain of it waits its whole timeout (60 s) and has stopped nothing while
    the block runs."""
    done = threading.Event()

    def one(room: int) -> None:
        body = {
            "text": "hold the drain",
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True},
            "bootstrap_host": prefill.split("//")[1].split(":")[0],
            "bootstrap_port": bootstrap_port,
            "bootstrap_room": room,
        }
        with ThreadPoolExecutor(2) as legs:
            for url in (prefill, decode):
                legs.submit(requests.post, f"{url}/generate", json=body, timeout=(5, 300))

    def loop(first_room: int) -> None:
        room = first_room
        while not done.is_set():
            with contextlib.suppress(requests.RequestException):
                one(room)
            room += 2

    threads = [threading.Thread(target=loop, args=(r,), daemon=True) for r in (1000, 1001)]
    threads[0].start()
    time.sleep(10)  # half a request (1,500 tokens at about 19 ms)
    threads[1].start()
    try:
        yield
    finally:
        done.set()


# It cuts the second host off the bridge (its link down, the host running), then puts it back.
def test_a_host_cut_off_mid_roll_and_mid_recovery_converges_once_back(
    fleet_site: Site, fleet: TestFleet, tmp_path: Path
) -> None:
    """Host 2 cut off while its roll drains a pair that holds a request: site.yml fails
    naming it; its lease, the lock, ends with its renewals on the majority side (hosts 1 and 3
    keep the store's quorum), so a restart on host 1 goes on without gateway 2, naming it,
    with no failed request through gateway 1, which routes around host 2. On host 2, the
    minority member refuses writes: a restart there refuses in one line, the cut-off roll
    never stops its drained pair (fencing), and a decode killed there is contained (its prefill
    stopped) while its recovery waits. The link back, with no operator step: the drained pair
    is registered again with its engines untouched (pdstack-finish.timer) and the crashed one
    is recovered."""
    first, second, _ = fleet.hosts
    dep = fleet_site.deployment()
    gateway = dep["gateway"]["url"]
    insts = {i["inst"]["id"]: i["inst"] for h in dep["hosts"].values() for i in h["instances"]}
    lost, crashed = f"{second.name}/pd0", f"{second.name}/pd1"
    lost_urls = {insts[f"{lost}-{r}"]["url"] for r in names.ROLES}
    pd0_units = _units(["pd0"])
    pd0_pids = [_main_pid(second, u) for u in pd0_units]
    start = time.monotonic()
    # The roll is limited to host 2, so its first pair is the one cut off: rolling hosts 1 and
    # 3 as well (before the cut and after it) tested nothing more and took 3-4 minutes.
    changed = _profile(tmp_path / "changed.yml", 2048)
    holding = _always_in_flight(
        insts[f"{lost}-prefill"]["url"],
        insts[f"{lost}-decode"]["url"],
        insts[f"{lost}-prefill"]["bootstrap_port"],
    )
    with holding, ThreadPoolExecutor(1) as pool:
        roll = pool.submit(fleet_site.run, "--limit", second.name, profile=changed)
        wait_for(
            lambda: roll.done() or not (lost_urls & gateway_urls(gateway)),
            CONVERGE_TIMEOUT,
            f"{lost} drained at {gateway}",
        )
        assert not roll.done(), roll.result().output[-4000:]
        held = lease(first)
        assert held and held["host"] == second.name and lost in held["targets"], held
        _cut(second, up=False)
        try:
            _while_cut_off(fleet, fleet_site, roll.result(timeout=CONVERGE_TIMEOUT + 60))
        finally:
            _cut(second, up=True)
    print(f"host 2 cut off mid-roll: {time.monotonic() - start:.0f}s")
    back = time.monotonic()
    wait_for(lambda: serving(fleet, lost, crashed), 300, f"{lost} and {crashed} serving again")
    print(f"link back to both pairs serving: {time.monotonic() - back:.0f}s")
    # The cut-off roll stopped before it stopped anything: the same engines serve.
    assert [_main_pid(second, u) for u in pd0_units] == pd0_pids
    # The roll's change never reached host 2's engines: applied as a second run would.
    again = second.ssh(f"{PDCTL} restart --both --pair {lost} --yes --lock-wait 300", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]


def _while_cut_off(fleet: TestFleet, site: Site, run: Run) -> None:
    """What test_a_host_cut_off_mid_roll_and_mid_recovery_converges_once_back shows while
    host 2 is off the bridge: first the majority side, then host 2's."""
    first, second, _ = fleet.hosts
    dep = site.deployment()
    gateway1, gateway2 = dep["gateway"]["url"], dep["gateway"]["urls"][second.name]
    host2_urls = {i["inst"]["url"] for i in dep["hosts"][second.name]["instances"]}
    assert run.result.returncode != 0, run.output[-4000:]
    assert re.search(rf"\[{second.name}\]: UNREACHABLE", run.output), run.output[-4000:]
    # The majority side: host 2's lease ends with its renewals; gateway 1 routes around it.
    wait_for(lambda: lease(first) is None, LOCK_TTL_S + 30, "host 2's lease to end")
    wait_for(
        lambda: (
            not any(
                w.healthy for w in GatewayAdmin(gateway1, API_KEY).workers() if w.url in host2_urls
            )
        ),
        60,
        "gateway 1 to mark host 2's engines unhealthy",
    )
    with site_load(gateway1) as outcomes:
        flowed(outcomes)
        took = first.ssh(f"{PDCTL} restart --both --pair {first.name}/pd0 --yes", timeout=600)
        flowed(outcomes)
    assert took.returncode == 0, took.stdout[-3000:] + took.stderr[-3000:]
    assert f"gateway {gateway2} is gone" in took.stderr, took.stderr[-3000:]
    failed = [o.failure for o in outcomes if not o.ok]
    print(f"host 2 cut off: {len(outcomes)} requests through gateway 1, {len(failed)} failed")
    assert not failed, failed[:10]
    status = {p["id"]: p["gateway"] for p in host_status(first)["pairs"]}
    assert status[f"{first.name}/pd0"] == "routed", status
    assert status[f"{second.name}/pd0"] == "not routed", status  # shown, not hidden
    # Host 2: the cut-off roll ends after its drain (it holds the host's own restart lock
    # until then), at its fencing check; then the minority member refuses a restart's lease.
    wait_for(
        lambda: _inside(second, f"flock -n {names.RESTART_LOCK} true").returncode == 0,
        120,
        "the cut-off roll's pdctl to end on host 2",
    )
    refused = _inside(second, f"{PDCTL} restart --both --pair {second.name}/pd1 --yes")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
    assert refused.returncode == 5 and len(errors) == 1, refused.stdout + refused.stderr
    assert "etcd has no quorum" in errors[0], errors
    # A crash there: contained while its recovery waits for the store.
    decode, prefill = (names.engine_unit("pd1", r) for r in ("decode", "prefill"))
    pid = _inside(second, f"systemctl show -p MainPID --value {decode}").stdout.strip()
    assert _inside(second, f"kill -9 {pid}").returncode == 0  # by PID
    wait_for(
        lambda: _inside(second, f"systemctl is-active {prefill}").stdout.strip() == "inactive",
        90,
        f"{second.name}/pd1's prefill stopped (contained)",
    )


# ----- the store's faults (issue 19): quorum lost, a paused holder ----------------------
def _cut(*hosts: TestHost, up: bool) -> None:
    """Take the hosts' links to the fleet's bridge (the host side of their veths) down, or up
    again; back up, wait (bounded) until the controller reaches each host and each host reaches
    etcd: neighbour entries that failed while a host was cut off, on either side, take a few
    seconds to resolve anew, and an ssh or a restart in that window fails on "No route to
    host"."""
    for h in hosts:
        state = "up" if up else "down"
        subprocess.run(["ip", "link", "set", f"vb-{h.name}", state], check=True, timeout=30)
    for h in hosts if up else ():
        wait_for(partial(_reaches_etcd, h), 60, f"{h.name} back on the bridge")


def _reaches_etcd(host: TestHost) -> bool:
    return host.ssh(f"{PDCTL} lock show").returncode == 0


def _background(host: TestHost, command: str) -> subprocess.Popen[str]:
    """`command` on `host` over ssh, not waited for (its output kept for communicate())."""
    return subprocess.Popen(
        host.ssh_argv(command), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _unit_state(host: TestHost, unit: str) -> str:
    return host.ssh(f"systemctl show -p ActiveState --value {unit}", check=True).stdout.strip()


def _main_pid(host: TestHost, unit: str) -> int:
    return int(host.ssh(f"systemctl show -p MainPID --value {unit}", check=True).stdout)


def serving_at(host: TestHost, gateway: str, pair_id: str) -> bool:
    """The pair's canary passes (`pdctl status` on `host`) and `gateway` routes to both of
    its engines (status reads the first gateway's view, which may be the one that is gone)."""
    st = host_status(host)
    ids = {names.instance_name(pair_id, r) for r in names.ROLES}
    urls = {i["url"] for i in st["instances"] if i["id"] in ids}
    (pair,) = [p for p in st["pairs"] if p["id"] == pair_id]
    try:
        workers = GatewayAdmin(gateway, API_KEY).workers()
    except PdctlError:
        return False
    ready = {w.url for w in workers if w.healthy and w.status == "ready"}
    return bool(pair["canary"]["ok"]) and len(urls) == 2 and urls <= ready


def _gateway_workers(url: str) -> set[str]:
    """The worker URLs a gateway holds (any state), or none when it does not answer."""
    try:
        return {w.url for w in GatewayAdmin(url, API_KEY).workers()}
    except PdctlError:
        return set()


def test_without_quorum_restarts_refuse_and_a_crashed_pair_waits_contained(
    fleet_site: Site, fleet: TestFleet
) -> None:
    """Two of three members cut off: a restart refuses in one line; a decode killed on the
    host left alone is drained from its gateway and its prefill stopped (no request routed
    into a half pair), and the pair is recovered once quorum is back."""
    first, second, third = fleet.hosts
    dep = fleet_site.deployment()
    crashed = f"{second.name}/pd0"
    decode = names.engine_unit("pd0", "decode")
    prefill = names.engine_unit("pd0", "prefill")
    urls = {
        i["inst"]["url"]
        for i in dep["hosts"][second.name]["instances"]
        if i["inst"]["pair"] == "pd0"
    }
    gateway2 = dep["gateway"]["urls"][second.name]
    assert serving(fleet, crashed)
    _cut(first, third, up=False)
    try:
        refused = second.ssh(f"{PDCTL} restart --both --pair {second.name}/pd1 --yes", timeout=120)
        assert refused.returncode == 5, refused.stdout[-2000:] + refused.stderr[-2000:]
        errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "etcd has no quorum: 1 of 3 members answer" in errors[0], (
            refused.stderr
        )
        second.ssh(f"kill -9 {_main_pid(second, decode)}", check=True)  # by PID
        wait_for(
            lambda: (
                _unit_state(second, prefill) == "inactive" and not urls & _gateway_workers(gateway2)
            ),
            90,
            f"{crashed} out of gateway 2 and its prefill stopped",
        )
        waiting = {p["id"]: p for p in host_status(second)["pairs"]}
        assert (waiting[crashed]["recovery"] or "").startswith(
            "recovery waiting: etcd cannot serve"
        ), waiting[crashed]
        assert _unit_state(second, names.recover_unit("pd0")) == "activating"
    finally:
        _cut(first, third, up=True)
    back = time.monotonic()
    wait_for(lambda: serving(fleet, crashed), 180, f"{crashed} recovered after quorum is back")
    print(f"quorum back to {crashed} serving: {time.monotonic() - back:.0f}s")


@contextlib.contextmanager
def _finisher_off(host: TestHost) -> Iterator[None]:
    """`host`'s pdstack-finish.timer stopped for the block, started again after it."""
    host.ssh("systemctl stop pdstack-finish.timer", check=True)
    try:
        yield
    finally:
        host.ssh("systemctl start pdstack-finish.timer")


def test_a_paused_holder_loses_the_lock_and_stops_before_its_next_step(
    fleet_site: Site, fleet: TestFleet
) -> None:
    """SIGSTOP past the ttl: the controller's restart takes the lock; the paused restart,
    resumed while the controller holds it, stops before its next step and says why. Host 1's
    pdstack-finish.timer is off meanwhile: it would take up the paused restart's pair once the
    lease ends, racing the controller for the lock (test_ops_recovery.py shows the timer)."""
    first, second, _ = fleet.hosts
    with _finisher_off(first):
        paused = _background(first, f"{PDCTL} restart --both --pair {first.name}/pd1 --yes")
        try:
            held = wait_for(
                lambda: (h := lease(second)) and h["host"] == first.name and h,
                60,
                "host 1's restart to take the lock",
            )
            first.ssh(f"kill -STOP {held['pid']}", check=True)
            wait_for(
                lambda: lease(second) is None, LOCK_TTL_S + 30, "the paused holder's lease to end"
            )
            with ThreadPoolExecutor(1) as pool:
                other = pool.submit(
                    controller_pdctl, fleet, fleet_site.profile,
                    "restart", "--both", "--pair", f"{second.name}/pd1", "--yes", timeout=600,
                )  # fmt: skip
                wait_for(
                    lambda: other.done() or ((h := lease(second)) and h["pid"] != held["pid"]),
                    60,
                    "the controller's lock",
                )
                # A controller restart that ended before anyone saw it hold the lock failed early.
                assert not other.done(), (
                    other.result().stdout[-3000:] + other.result().stderr[-3000:]
                )
                first.ssh(f"kill -CONT {held['pid']}", check=True)
                out, err = paused.communicate(timeout=300)
                took = other.result()
        finally:
            first.ssh(f"kill -CONT {held['pid']}")
            if paused.poll() is None:
                paused.kill()
        assert took.returncode == 0, took.stdout[-3000:] + took.stderr[-3000:]
        assert (
            f"the last holder of the fleet restart lock, {first.name} PID {held['pid']}"
            in took.stderr
        )
        assert paused.returncode == 1, out[-3000:] + err[-3000:]
        assert "stopped before it: this restart no longer holds the fleet restart lock" in out + err
        restored = first.ssh(f"{PDCTL} restart --both --pair {first.name}/pd1 --yes", timeout=600)
        assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
        history = json.loads(
            controller_pdctl(
                fleet, fleet_site.profile, "history", "--format", "json", "--limit", "5"
            ).stdout
        )
        assert [r["result"] for r in history["restarts"][:3]] == ["ok", "ok", "failed"], history


# Last of all: host 1 is powered off for good.
def test_with_host_1_powered_off_restarts_and_recoveries_go_on(
    fleet_site: Site, fleet: TestFleet
) -> None:
    """Host 1 (an etcd member, the first gateway, monitoring) powered off: a restart from the
    controller of a pair on host 2 succeeds (gateway 1 is gone: no key), and a decode killed
    on host 3 is recovered automatically at the first try, under streaming load through
    gateway 2, with no failed request but the killed pair's own in-flight ones. (Under load
    the live prefill takes its time to stop: the recovery's stop must wait for it, or the new
    decode registers with the old prefill and every KV transfer fails.)"""
    first, second, third = fleet.hosts
    dep = fleet_site.deployment()
    gateway2 = dep["gateway"]["urls"][second.name]
    host1_urls = {i["inst"]["url"] for i in dep["hosts"][first.name]["instances"]}
    first.down()
    wait_for(
        lambda: all(
            not w.healthy for w in GatewayAdmin(gateway2, API_KEY).workers() if w.url in host1_urls
        ),
        60,
        "gateway 2 to mark host 1's engines unhealthy",
    )
    decode = names.engine_unit("pd1", "decode")
    recover_unit = names.recover_unit("pd1")
    killed = f"{third.name}/pd1"
    with site_load(gateway2) as outcomes:
        flowed(outcomes)
        restarted = controller_pdctl(
            fleet, fleet_site.profile, "restart", "--both", "--pair", f"{second.name}/pd0", "--yes",
            timeout=600,
        )  # fmt: skip
        before_kill = len(outcomes)
        since = third.ssh("date +%s", check=True).stdout.strip()
        t_kill = time.monotonic()
        third.ssh(f"kill -9 {_main_pid(third, decode)}", check=True)
        wait_for(lambda: serving_at(second, gateway2, killed), 300, f"{killed} recovered")
        recovered_s = time.monotonic() - t_kill
        flowed(outcomes)
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]
    assert "is gone (no key of its host in etcd" in restarted.stderr, restarted.stderr[-3000:]
    journal = third.ssh(
        f"journalctl -u {recover_unit} --since @{since} -o cat --no-pager", check=True
    ).stdout
    assert journal.count(f"{killed}: restarting") == 1, journal[-3000:]  # no second try
    assert f"{killed}: recovered: restarted prefill and decode together" in journal, journal
    failed_before = [o.failure for o in outcomes[:before_kill] if not o.ok]
    failed_after = [o.failure for o in outcomes[before_kill:] if not o.ok]
    print(
        f"host 1 off: kill -9 to {killed} serving {recovered_s:.0f}s; {len(outcomes)} requests, "
        f"{len(failed_before)} failed before the kill, {len(failed_after)} after"
    )
    assert not failed_before, failed_before[:10]
    assert len(failed_after) <= CLIENTS, failed_after  # at most the killed pair's in-flight ones
