"""pdctl status/doctor/restart and automatic recovery on a real systemd host.

A host of its own ("pdops", not the session host test_site.py starts from fresh), converged by
site.yml with the sim profile; pdctl runs on the host from the deployed venv, reading the
topology file site.yml wrote. Processes are signalled by PID only.

The sim profile here turns on PDSIM_DEGRADED: the production incident pdctl doctor and
`restart --both` exist for (a lone restart leaves the pair degraded) is modelled; real NIXL over
host memory, which the shipped sim profile uses, keeps such a pair working (docs/sim.md).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml
from fixtures_site import (
    API_KEY,
    PDCTL,
    SIM_PROFILE,
    Site,
    build_wheelhouse,
    site_load,
    two_pair_profile,
    wait_ready,
    write_profile,
)

from pdctl.ops.report import PHASES
from pdctl.testing.stack import Outcome, flowed, served_model, stream_chat

if TYPE_CHECKING:
    from conftest import TestHost

pytestmark = pytest.mark.e2e

CANARIES = "--canaries 12"  # a degraded sim pair fails half its requests: 12 cannot all pass


@pytest.fixture(scope="module")
def ops_site(
    testhost_factory: Callable[..., TestHost], tmp_path_factory: pytest.TempPathFactory
) -> Site:
    host = testhost_factory("pdops")
    profile = yaml.safe_load(SIM_PROFILE.read_text())
    profile["sim"]["PDSIM_DEGRADED"] = "on"
    path = write_profile(tmp_path_factory.mktemp("ops") / "sim-degraded.yml", profile)
    site = Site(host, build_wheelhouse(path, host.inventory), path, finish_interval_s=30)
    site.run().assert_ok()
    wait_ready(site.deployment()["gateway"]["url"])
    return site


def pdctl(host: TestHost, args: str) -> tuple[int, str, str]:
    r = host.ssh(f"{PDCTL} {args}", timeout=600)
    return r.returncode, r.stdout, r.stderr


def status(host: TestHost) -> dict[str, Any]:
    code, out, err = pdctl(host, f"status --format json {CANARIES}")
    assert out, err
    result: dict[str, Any] = json.loads(out)
    assert code == (0 if result["healthy"] else 1)
    return result


def main_pids(host: TestHost, units: list[str]) -> list[int]:
    out = host.ssh(f"systemctl show -p MainPID --value {' '.join(units)}", check=True).stdout
    return [int(x) for x in out.split()]


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


def test_healthy_after_converge(ops_site: Site) -> None:
    s = status(ops_site.host)
    assert s["healthy"], s
    assert {i["active"] for i in s["instances"]} == {"active"}
    # Every instance is held ready at every gateway (status JSON: its worker per gateway URL).
    held = [w for i in s["instances"] for w in i["gateways"].values()]
    assert len(held) == len(s["instances"]) * len(s["gateways"]) >= len(s["instances"]), s
    assert all(w is not None and w["status"] == "ready" for w in held), s


def test_lone_decode_restart_is_degraded_until_restart_both(ops_site: Site) -> None:
    host = ops_site.host
    pair = f"{host.name}/pd0"
    host.ssh("systemctl restart pdstack-pd0-decode.service", check=True)
    wait_for(
        lambda: all(i["health"] == "ok" for i in status(host)["instances"]),
        60,
        "the decode to answer /health",
    )
    s = status(host)
    (p,) = s["pairs"]
    assert not p["canary"]["ok"], s  # both answer /health, the PD path is broken
    code, out, _ = pdctl(host, f"doctor {CANARIES}")
    assert code == 2
    assert f"ERROR live-degraded-pair [{pair}]: degraded group" in out
    assert f"fix: run pdctl restart --both --pair {pair}" in out

    code, out, err = pdctl(host, "restart --both --pair pd0 --yes")
    assert code == 0, err
    assert f"OK: {pair}-prefill" in out and f"OK: {pair}-decode" in out
    assert status(host)["healthy"]
    code, out, _ = pdctl(host, f"doctor {CANARIES}")
    assert "ERROR" not in out, out


def test_kill_9_of_the_decode_recovers_the_whole_pair(ops_site: Site) -> None:
    host = ops_site.host
    units = ["pdstack-pd0-prefill.service", "pdstack-pd0-decode.service"]
    on_failure = host.ssh(f"systemctl show -p OnFailure --value {' '.join(units)}", check=True)
    assert on_failure.stdout.split() == ["pdstack-recover@pd0.service"] * 2
    before = main_pids(host, units)
    since = host.ssh("date '+%Y-%m-%d %H:%M:%S'", check=True).stdout.strip()
    killed = time.monotonic()
    host.ssh(f"kill -9 {before[1]}", check=True)  # by PID, never by pattern

    def recovered() -> bool:
        after = main_pids(host, units)
        done = host.ssh("systemctl show -p ActiveState --value pdstack-recover@pd0.service")
        return all(after) and not set(after) & set(before) and done.stdout.strip() == "inactive"

    wait_for(recovered, 180, "pdstack-recover@pd0 to restart the pair")
    print(f"kill -9 to the pair recovered (one host, etcd on it): {time.monotonic() - killed:.0f}s")
    journal = host.ssh(
        f"journalctl -u pdstack-recover@pd0.service --since '{since}' -o cat", check=True
    ).stdout
    assert f"{host.name}/pd0: restarting {units[0]} + {units[1]}" in journal
    assert f"OK: {host.name}/pd0-prefill" in journal and f"OK: {host.name}/pd0-decode" in journal
    # No lone restart: the decode started once, after the pair target was stopped.
    events = host.ssh(
        f"journalctl --since '{since}' -o cat -u {units[1]} -u pdstack-pd0.target "
        "| grep -E '^(Started|Stopped|Starting|Stopping) '",
        check=True,
    ).stdout
    started_decode = [e for e in events.splitlines() if e.startswith("Started") and "decode" in e]
    assert len(started_decode) == 1, events
    assert status(host)["healthy"]


def test_a_restart_killed_half_way_is_finished_by_the_timer(ops_site: Site) -> None:
    """SIGKILL of `pdctl restart` while it waits for the new engines' health: its phase record
    outlives it, and pdstack-finish.timer brings the pair back without an operator."""
    host = ops_site.host
    units = ["pdstack-pd0-prefill.service", "pdstack-pd0-decode.service"]
    assert host.ssh("systemctl is-active pdstack-finish.timer").stdout.strip() == "active"
    (_, decode) = main_pids(host, units)
    since = host.ssh("date '+%Y-%m-%d %H:%M:%S'", check=True).stdout.strip()
    # On the host itself, so the kill lands inside the health wait (the sim starts in ~2 s):
    # once the decode runs under a new PID, the restart has stopped and started the pair.
    new_pid = f"systemctl show -p MainPID --value {units[1]}"
    host.ssh(
        f"{PDCTL} restart --both --pair pd0 --yes >/tmp/killed-restart.log 2>&1 & pdctl=$!; "
        f'until p=$({new_pid}); [ "$p" != 0 ] && [ "$p" != {decode} ]; do sleep 0.05; done; '
        "kill -9 $pdctl",
        check=True,
        timeout=120,
    )
    killed = time.monotonic()

    def finished() -> bool:
        s = status(host)
        return s["healthy"] and s["pairs"][0]["abandoned"] is None

    wait_for(finished, 180, "pdstack-finish.timer to finish the abandoned restart")
    took = time.monotonic() - killed
    print(f"restart SIGKILLed in its health wait to the pair serving again: {took:.0f}s")
    journal = host.ssh(
        f"journalctl -u pdstack-finish.service --since '{since}' -o cat", check=True
    ).stdout
    # The kill lands once the new decode runs: in start, health or (on a loaded machine) later.
    taken = re.search(
        rf"{host.name}/pd0: abandoned restart of {host.name}/pd0 at phase (\w+) .*: taking it "
        r"up at (\w+)",
        journal,
    )
    assert taken and taken[1] in PHASES[2:], journal
    assert taken[2] == ("drain" if taken[1] == "start" else "health"), journal
    assert f"OK: {host.name}/pd0-prefill" in journal and f"OK: {host.name}/pd0-decode" in journal
    code, out, _ = pdctl(host, "history --format json --limit 2")
    assert code == 0
    finish, lost = json.loads(out)["restarts"]
    assert (finish["command"], finish["result"]) == (f"pdctl finish {host.name}/pd0", "ok")
    assert lost["result"] == "lost"


def _timed_ssh(host: TestHost, command: str) -> float:
    """Seconds `command` took on the host."""
    out = host.ssh(f"s=$(date +%s.%N); {command}; e=$(date +%s.%N); echo $s $e", check=True)
    start, end = out.stdout.split()[-2:]
    return float(end) - float(start)


def test_systemctl_stop_of_a_loaded_pair_finishes_its_requests_and_starts_no_recovery(
    ops_site: Site,
) -> None:
    """A host shutdown's stop (no gateway drain first): KillMode=mixed sends SIGTERM to each
    engine's main process only, which serves its requests to the end within TimeoutStopSec,
    then exits 0, so OnFailure= starts no recovery. A planned restart of the idle pair then
    pays at most sigterm_watchdog's 5 s check per stop, no scheduler wait."""
    host = ops_site.host
    url = ops_site.deployment()["gateway"]["url"]
    units = ["pdstack-pd0-prefill.service", "pdstack-pd0-decode.service"]
    stop = f"systemctl stop pdstack-pd0.target {' '.join(units)}"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {API_KEY}"
    model = served_model(url, session.headers)
    outcomes: list[Outcome] = []

    def one() -> None:  # about 11 s of decode at the sim's 18 ms a step
        outcomes.append(stream_chat(session, url, model, 600, 120))

    since = host.ssh("date '+%Y-%m-%d %H:%M:%S'", check=True).stdout.strip()
    clients = [threading.Thread(target=one) for _ in range(4)]
    for c in clients:
        c.start()
    time.sleep(3)  # the four are decoding: none ends before 8 s more
    stopped_in = _timed_ssh(host, stop)
    for c in clients:
        c.join(120)
    failed = [o.failure for o in outcomes if not o.ok]
    print(f"systemctl stop of the loaded pair: {stopped_in:.1f}s, {len(failed)} of 4 lost")
    assert len(outcomes) == 4 and not failed, failed
    assert stopped_in > 3  # it waited for them
    state = host.ssh(f"systemctl show -p Result -p ActiveState {' '.join(units)}", check=True)
    assert sorted(state.stdout.split()) == ["ActiveState=inactive"] * 2 + ["Result=success"] * 2
    recover = host.ssh(
        f"journalctl -u pdstack-recover@pd0.service --since '{since}' -o cat", check=True
    ).stdout
    assert "Start" not in recover, recover

    code, _, err = pdctl(host, "restart --both --pair pd0 --yes")
    assert code == 0, err
    wait_for(lambda: status(host)["healthy"], 120, "the pair back after its stop")
    idle_stop = _timed_ssh(host, stop)
    restarted = time.monotonic()
    code, _, err = pdctl(host, "restart --both --pair pd0 --yes")
    assert code == 0, err
    print(
        f"idle pair: systemctl stop {idle_stop:.1f}s; pdctl restart --both of the stopped pair "
        f"{time.monotonic() - restarted:.1f}s"
    )
    assert idle_stop < 5 + 3  # one drain check and the children's exit, no 15 s wait
    assert status(host)["healthy"]


def test_restart_all_of_two_pairs_under_load_fails_no_request(
    ops_site: Site, tmp_path: Path
) -> None:
    host = ops_site.host
    ops_site.run(profile=two_pair_profile(ops_site.profile, tmp_path / "two-pairs.yml")).assert_ok()
    url = ops_site.deployment()["gateway"]["url"]
    wait_ready(url)
    # site.yml ends once the gateway has one healthy PD path (/readiness), not once the pair it
    # added is healthy too (CI 33: pd1 not yet, right after the run): wait for both, bounded.
    wait_for(lambda: status(host)["healthy"], 120, "pdctl status to see both pairs healthy")
    with site_load(url) as outcomes:
        flowed(outcomes)
        code, out, err = pdctl(host, "restart --both --all --yes")
        flowed(outcomes)
    assert code == 0, err
    assert out.count("OK: ") == 4, out
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    assert len(outcomes) > 50
