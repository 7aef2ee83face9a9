"""xPyD groups over a fleet of three test hosts (deploy/profiles/sim-fleet-groups.yml): on
every host a 2P1D group `g0` (host-local), and once in the fleet a 1P2D group `g1` whose
prefill runs on host 1 and whose decodes run on hosts 2 and 3 (KV over TCP: allow_tcp_kv).

In file order: the converge, the group across hosts in `pdctl status` on a host that holds
none of its prefills (canary through every member), a config change rolled under streaming
load one group at a time (the three members of `g1` out together and back together, no failed
request, no KV transfer between groups, a second run that changes nothing), and a decode of
`g1` killed on host 3 and recovered as a group by host 3's recovery unit (its members on hosts
1 and 2 restarted over the hosts' own ssh).

Its own fleet (``PDSTACK_FLEET_NAME`` + ``g``), so that it runs in a lane beside
test_fleet.py's.
"""

from __future__ import annotations

import json
import re
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml
from fixtures_site import (
    API_KEY,
    CLIENTS,
    Site,
    build_wheelhouse,
    groups_profile,
    host_status,
    roll_under_load,
    site_load,
    write_profile,
)

from pdctl import names
from pdctl.ops.gateway import GatewayAdmin
from pdctl.testing.stack import CROSS_GROUP_METRIC, flowed, wait_until

if TYPE_CHECKING:
    from conftest import TestFleet, TestHost

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HOST_LOCAL = "g0"  # 2P1D on every host
ACROSS = "g1"  # 1P2D: prefill on host 1, decodes on hosts 2 and 3


@pytest.fixture(scope="module")
def groups_site(groups_fleet: TestFleet, tmp_path_factory: pytest.TempPathFactory) -> Site:
    hosts = [h.name for h in groups_fleet.hosts]
    profile = groups_profile(hosts, tmp_path_factory.mktemp("profile") / "groups.yml")
    return Site(groups_fleet, build_wheelhouse(profile, groups_fleet.inventory), profile)


def _instances(site: Site) -> list[dict[str, Any]]:
    return [i["inst"] for h in site.deployment()["hosts"].values() for i in h["instances"]]


def main_pids(site: Site, fleet: TestFleet) -> dict[str, int]:
    """MainPID of every engine of the fleet, by instance id (HOST/NAME)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for inst in _instances(site):
        by_host.setdefault(inst["id"].split("/")[0], []).append(inst)
    pids = {}
    for h in fleet.hosts:
        units = [i["unit"] for i in by_host[h.name]]
        out = h.ssh(f"systemctl show -p MainPID --value {' '.join(units)}", check=True).stdout
        pids.update({i["id"]: int(p) for i, p in zip(by_host[h.name], out.split(), strict=True)})
    return pids


def group_windows(fleet: TestFleet, since: float) -> dict[str, tuple[float, float, int]]:
    """Per group (HOST/g0 for the host-local ones, g1 once), from the first stop of one of
    its targets to the last start, and how many target jobs it had; from every host's journal
    (the hosts share the controller's clock)."""
    filters = " ".join(f"UNIT={names.pair_target(g)}" for g in (HOST_LOCAL, ACROSS))
    jobs: dict[str, list[tuple[float, str]]] = {}
    for h in fleet.hosts:
        cmd = f"journalctl -o json --no-pager --since @{int(since)} {filters}"
        for line in h.ssh(cmd, check=True).stdout.splitlines():
            rec = json.loads(line)
            if rec.get("JOB_TYPE") in ("stop", "start") and rec.get("JOB_RESULT") == "done":
                group = ACROSS if rec["UNIT"] == names.pair_target(ACROSS) else f"{h.name}/g0"
                t = int(rec["__REALTIME_TIMESTAMP"]) / 1e6
                jobs.setdefault(group, []).append((t, rec["JOB_TYPE"]))
    windows = {}
    for group, js in jobs.items():
        js.sort()
        assert js[0][1] == "stop" and js[-1][1] == "start", (group, js)
        last_stop = max(t for t, kind in js if kind == "stop")
        first_start = min(t for t, kind in js if kind == "start")
        # The group is out as one: every target stopped before any starts again.
        assert last_stop <= first_start, (group, js)
        windows[group] = (js[0][0], js[-1][0], len(js))
    return windows


class CrossGroupWatch:
    """Every decode's `pdsim_cross_group_transfers_total`, polled every 0.5 s while a block
    runs. The counter dies with its process: a value lower than the last one read is a new
    process, and the old one's last reading is kept. (A drain lets in-flight requests finish
    before a stop, so a transfer is counted well before its decode goes.)"""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.last = dict.fromkeys(urls, 0.0)
        self.total = dict.fromkeys(urls, 0.0)
        self.read: set[str] = set()
        self.stop = threading.Event()

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            for url in self.urls:
                try:
                    text = requests.get(f"{url}/metrics", timeout=2).text
                except requests.RequestException:
                    continue  # stopped or starting
                values = [
                    float(x.split()[-1])
                    for x in text.splitlines()
                    if x.startswith(CROSS_GROUP_METRIC)
                ]
                if not values:
                    continue
                self.read.add(url)
                v = sum(values)
                if v < self.last[url]:
                    self.total[url] += self.last[url]
                self.last[url] = v

    def __enter__(self) -> CrossGroupWatch:
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        for url in self.urls:
            self.total[url] += self.last[url]


def test_groups_converge_across_the_fleet(groups_site: Site, groups_fleet: TestFleet) -> None:
    run = groups_site.run()
    run.assert_ok()
    assert sorted(run.recaps) == sorted(h.name for h in groups_fleet.hosts)
    print(f"converge: {run.seconds:.0f}s")
    first, second, third = groups_fleet.hosts
    # Host-to-host ssh for the group across hosts: the key and its known hosts on every
    # host that holds a member of it.
    for h in (first, second, third):
        check = f"test -s {names.PEER_SSH_KEY} && test -s {names.PEER_SSH_KNOWN_HOSTS}"
        assert h.ssh(check).returncode == 0, h.name


def test_status_shows_the_group_across_hosts_with_every_member(groups_fleet: TestFleet) -> None:
    first, second, third = groups_fleet.hosts
    st = host_status(third)  # holds a decode of g1, not its prefill
    (g1,) = [p for p in st["pairs"] if p["id"] == ACROSS]
    assert g1["canary"]["ok"], g1
    members = {i["id"] for i in st["instances"] if i["id"].split("/")[1].startswith(f"{ACROSS}-")}
    assert members == {
        f"{first.name}/{names.instance_name(ACROSS, 'prefill', 0)}",
        f"{second.name}/{names.instance_name(ACROSS, 'decode', 0)}",
        f"{third.name}/{names.instance_name(ACROSS, 'decode', 1)}",
    }, members
    local = [p for p in st["pairs"] if p["id"].endswith(f"/{HOST_LOCAL}")]
    assert sorted(p["id"] for p in local) == sorted(f"{h.name}/g0" for h in groups_fleet.hosts)
    assert all(p["canary"]["ok"] for p in local), local


def _changed(site: Site, path: Path, context_length: int) -> Path:
    profile = yaml.safe_load(site.profile.read_text())
    profile["engine"]["common"]["context_length"] = context_length
    return write_profile(path, profile)


def test_a_config_change_rolls_group_by_group_and_requests_stay_in_their_group(
    groups_site: Site, groups_fleet: TestFleet, tmp_path: Path
) -> None:
    before = main_pids(groups_site, groups_fleet)
    decodes = [i["url"] for i in _instances(groups_site) if i["role"] == "decode"]
    t0 = time.time() - 1
    changed = _changed(groups_site, tmp_path / "changed.yml", 4096)
    with CrossGroupWatch(decodes) as watch:
        roll_under_load(groups_site, changed)
    after = main_pids(groups_site, groups_fleet)
    assert all(after[k] != v for k, v in before.items()), (before, after)
    assert watch.read == set(decodes), f"never read: {set(decodes) - watch.read}"
    assert not any(watch.total.values()), f"KV transfers between groups: {watch.total}"
    windows = group_windows(groups_fleet, t0)
    assert sorted(windows) == sorted([ACROSS, *(f"{h.name}/g0" for h in groups_fleet.hosts)])
    assert windows[ACROSS][2] == 2 * len(groups_fleet.hosts), windows  # a stop, a start each
    # One group out at a time (pdstack_roll_max_unavailable 1): the windows do not overlap.
    spans = sorted(windows.values())
    assert all(a[1] <= b[0] for a, b in pairwise(spans)), windows
    again = groups_site.run(profile=changed)
    again.assert_ok()
    counts = {h: r["changed"] for h, r in again.recaps.items()}
    assert set(counts.values()) == {0}, f"{counts}: {again.changed_tasks()}"
    groups_site.profile = changed


def _main_pid(host: TestHost, unit: str) -> int:
    return int(host.ssh(f"systemctl show -p MainPID --value {unit}", check=True).stdout)


def test_a_decode_of_the_group_across_hosts_killed_recovers_the_whole_group(
    groups_site: Site, groups_fleet: TestFleet
) -> None:
    first, second, third = groups_fleet.hosts
    gateway = groups_site.deployment()["gateway"]["url"]
    prefill = names.engine_unit(ACROSS, "prefill", 0)
    other_decode = names.engine_unit(ACROSS, "decode", 0)
    killed = names.engine_unit(ACROSS, "decode", 1)
    pids = {"prefill": _main_pid(first, prefill), "decode0": _main_pid(second, other_decode)}
    member_urls = {
        i["url"] for i in _instances(groups_site) if i["id"].split("/")[1].startswith(f"{ACROSS}-")
    }
    recover = names.recover_unit(ACROSS)
    since = third.ssh("date +%s", check=True).stdout.strip()

    def routed() -> bool:
        workers = GatewayAdmin(gateway, API_KEY).workers()
        live = {w.url for w in workers if w.healthy and w.status != "draining"}
        return member_urls <= live

    with site_load(gateway) as outcomes:
        flowed(outcomes)
        before_kill = len(outcomes)
        t_kill = time.monotonic()
        third.ssh(f"kill -9 {_main_pid(third, killed)}", check=True)
        wait_until(
            lambda: _main_pid(first, prefill) not in (0, pids["prefill"]) and routed(),
            300,
            f"{ACROSS} restarted on host 1 and routed again",
        )
        recovered_s = time.monotonic() - t_kill
        flowed(outcomes)

    def verdict() -> str | None:
        cmd = f"journalctl -u {recover} --since @{since} -o cat --no-pager"
        text = third.ssh(cmd, check=True).stdout
        return text if re.search(rf"{ACROSS}: recover(ed|y FAILED)", text) else None

    # The gateway routes the group once it is registered; the unit writes its verdict after
    # recording the restart in etcd and releasing the lock, a moment later.
    journal = wait_until(verdict, 60, f"{recover}'s verdict in its journal", step=0.5)
    assert journal.count(f"{ACROSS}: restarting") == 1, journal[-3000:]
    assert re.search(rf"{ACROSS}: recovered", journal), journal[-3000:]
    assert _main_pid(second, other_decode) not in (0, pids["decode0"]), "decode 0 not restarted"
    failed_before = [o.failure for o in outcomes[:before_kill] if not o.ok]
    failed_after = [o.failure for o in outcomes[before_kill:] if not o.ok]
    print(
        f"kill -9 to {ACROSS} routed again {recovered_s:.0f}s; {len(outcomes)} requests, "
        f"{len(failed_after)} failed after the kill"
    )
    assert not failed_before, failed_before[:10]
    assert len(failed_after) <= CLIENTS, failed_after  # at most the killed decode's in-flight
    (g1,) = [p for p in host_status(first)["pairs"] if p["id"] == ACROSS]
    assert g1["canary"]["ok"], g1
