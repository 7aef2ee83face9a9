"""site.yml rolls a config change the way `pdctl restart --both` does, on a host of its own
("rollsite", two pairs): pairs restart one at a time through drain, canary and register, with
zero failed streaming requests; --check names the pairs and files; with
pdstack_engine_restart_on_change=false the pairs keep running and `pdctl status` says
"restart pending" until they are restarted."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fixtures_site import (
    PDCTL,
    SIM_PROFILE,
    Site,
    build_wheelhouse,
    roll_under_load,
    two_pair_profile,
    wait_ready,
)

from pdctl import names

if TYPE_CHECKING:
    from conftest import TestHost

pytestmark = pytest.mark.e2e

HOST = "rollsite"
PAIRS = ("pd0", "pd1")
UNITS = [names.engine_unit(p, r) for p in PAIRS for r in names.ROLES]


def _profile(path: Path, context_length: int) -> Path:
    """The sim profile with two pairs and `engine.common.context_length`."""
    return two_pair_profile(SIM_PROFILE, path, context_length=context_length)


@pytest.fixture(scope="module")
def roll_site(
    testhost_factory: Callable[..., TestHost], tmp_path_factory: pytest.TempPathFactory
) -> Site:
    host = testhost_factory(HOST)
    profile = _profile(tmp_path_factory.mktemp("roll") / "two-pairs.yml", 8192)
    site = Site(host, build_wheelhouse(SIM_PROFILE, host.inventory), profile)
    first = site.run()
    first.assert_ok()
    # A fresh host: every pair is only started, nothing goes through a restart.
    assert "Roll the changed groups" not in " ".join(first.changed_tasks()), first.output[-3000:]
    wait_ready(site.deployment()["gateway"]["url"])
    return site


def main_pids(host: TestHost) -> list[int]:
    out = host.ssh(f"systemctl show -p MainPID --value {' '.join(UNITS)}", check=True).stdout
    return [int(x) for x in out.split()]


def status(host: TestHost) -> dict[str, Any]:
    r = host.ssh(f"{PDCTL} status --format json", timeout=300)
    assert r.stdout, r.stderr
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def target_jobs(host: TestHost, since: float) -> list[tuple[str, str]]:
    """(pair target, stop|start) of every finished systemd job on the pair targets, in order."""
    filters = " ".join(f"UNIT={names.pair_target(p)}" for p in PAIRS)
    out = host.ssh(
        f"journalctl -o json --no-pager --since @{int(since)} {filters}", check=True
    ).stdout
    jobs = []
    for line in out.splitlines():
        rec = json.loads(line)
        if rec.get("JOB_TYPE") in ("stop", "start") and rec.get("JOB_RESULT") == "done":
            jobs.append((rec["UNIT"], rec["JOB_TYPE"]))
    return jobs


def test_check_names_the_pairs_and_files_and_changes_nothing(
    roll_site: Site, tmp_path: Path
) -> None:
    host = roll_site.host
    before = main_pids(host)
    run = roll_site.run("--check", profile=_profile(tmp_path / "changed.yml", 4096))
    run.assert_ok()
    for pair in PAIRS:
        unit = re.escape(f"{names.UNIT_DIR}/{names.engine_unit(pair, 'prefill')}")
        assert re.search(rf"restart {HOST}/{pair}: [^\"]*{unit}", run.output), run.output[-4000:]
    assert main_pids(host) == before


def test_a_config_change_rolls_pair_by_pair_under_load(roll_site: Site, tmp_path: Path) -> None:
    host = roll_site.host
    before = main_pids(host)
    t0 = time.time() - 1
    changed = _profile(tmp_path / "changed.yml", 4096)
    run = roll_under_load(roll_site, changed)
    # One pair at a time: pd1 is stopped only once pd0 is back.
    t = [names.pair_target(p) for p in PAIRS]
    assert target_jobs(host, t0) == [
        (t[0], "stop"),
        (t[0], "start"),
        (t[1], "stop"),
        (t[1], "start"),
    ]
    assert all(a != b for a, b in zip(before, main_pids(host), strict=True))
    # ... and through pdctl's coordinated restart (its progress lines, in Ansible's -v output).
    out = run.output
    assert out.index(f"{HOST}/pd0: restarting") < out.index(f"{HOST}/pd1: restarting"), out[-4000:]
    again = roll_site.run(profile=changed)
    again.assert_ok()
    assert again.recap["changed"] == 0, again.changed_tasks()


def test_restart_on_change_false_leaves_pairs_pending(roll_site: Site, tmp_path: Path) -> None:
    host = roll_site.host
    before = main_pids(host)
    changed = _profile(tmp_path / "changed.yml", 2048)
    run = roll_site.run("-e", "pdstack_engine_restart_on_change=false", profile=changed)
    run.assert_ok()
    assert main_pids(host) == before  # still on the old files
    pending = {p["id"]: p["restart_pending"] for p in status(host)["pairs"]}
    for pair in PAIRS:
        line = pending[f"{HOST}/{pair}"]
        assert line and line.startswith("restart pending: "), pending
        assert names.engine_unit(pair, "prefill") in line
    table = host.ssh(f"COLUMNS=200 {PDCTL} status", timeout=300).stdout
    assert table.count("restart pending:") == 2, table
    r = host.ssh(f"{PDCTL} restart --both --pair {HOST}/pd0 --yes", timeout=600)
    assert r.returncode == 0, r.stderr
    pending = {p["id"]: p["restart_pending"] for p in status(host)["pairs"]}
    assert pending[f"{HOST}/pd0"] is None and pending[f"{HOST}/pd1"], pending
    # Back to restart_on_change=true: the pending pair restarts although no file changes now.
    pids = main_pids(host)
    back = roll_site.run(profile=changed)
    back.assert_ok()
    after = main_pids(host)
    assert after[:2] == pids[:2] and all(a != b for a, b in zip(after[2:], pids[2:], strict=True))
    assert not any(p["restart_pending"] for p in status(host)["pairs"])
