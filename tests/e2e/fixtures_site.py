"""Running site.yml against test hosts: the wheelhouse (built once per session) and a runner
that reads Ansible's recap."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml

from pdctl import names
from pdctl.testing.stack import Outcome, constant_load, flowed
from tests.conftest import filter_plugin

if TYPE_CHECKING:
    from conftest import TestFleet, TestHost

ROOT = Path(__file__).resolve().parents[2]
SIM_PROFILE = ROOT / "deploy" / "profiles" / "sim.yml"
API_KEY = "e2e-test-key"
CONVERGE_TIMEOUT = 600
PDCTL = f"{names.VENV}/bin/pdctl"  # on a test host
CLIENTS = 4  # constant_load's streaming clients: at most this many requests in flight
# Tokens per load request: each stream is in flight for about 0.7 s (32 decode steps), so a
# drain, a stop or a kill still meets requests mid-stream, at half the CPU of 8-token requests
# (0.08 against 0.16 cores of sims, smg and clients: benchmarks/load_cost.py). The load's CPU
# is taken from the rolls it watches, on a machine whose cores are busy.
LOAD_TOKENS = 32


def write_profile(path: Path, profile: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def two_pair_profile(base: Path, path: Path, **common: Any) -> Path:
    """`base` with a second pair pd1 (GPUs 2 and 3 of four) and `common` set in
    `engine.common`, written to `path`."""
    profile = yaml.safe_load(base.read_text())
    pd0 = profile["layout"]["pairs"][0]
    profile["layout"]["pairs"].append(
        {
            "name": "pd1",
            "prefill": {**pd0["prefill"], "gpus": [2], "port": 30010, "bootstrap_port": 9008},
            "decode": {**pd0["decode"], "gpus": [3], "port": 30011},
        }
    )
    profile["hardware"].update(gpu_count=4, numa_gpus={0: [0, 1, 2, 3]})
    profile["engine"]["common"].update(common)
    return write_profile(path, profile)


GROUPS_PROFILE = ROOT / "deploy" / "profiles" / "sim-fleet-groups.yml"


def groups_profile(hosts: list[str], path: Path) -> Path:
    """sim-fleet-groups.yml with its group across hosts on `hosts` (the fleet's first three)
    instead of make demo-fleet's pdfleet1-3, written to `path`."""
    profile = yaml.safe_load(GROUPS_PROFILE.read_text())
    for group in profile["layout"]["groups"]:
        for member in group["prefill"] + group["decode"]:
            if "host" in member:
                member["host"] = hosts[int(member["host"].removeprefix("pdfleet")) - 1]
    return write_profile(path, profile)


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    seconds: float

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr

    @property
    def recaps(self) -> dict[str, dict[str, int]]:
        """Counters of the PLAY RECAP lines, per host."""
        lines = re.findall(r"^(\S+)\s+:\s+(ok=.*)$", self.result.stdout, re.M)
        assert lines, f"no PLAY RECAP in:\n{self.output[-4000:]}"
        return {h: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", c)} for h, c in lines}

    @property
    def recap(self) -> dict[str, int]:
        """Counters of the PLAY RECAP line (one host)."""
        return next(iter(self.recaps.values()))

    def assert_ok(self) -> None:
        assert self.result.returncode == 0, self.output[-6000:]

    def changed_tasks(self) -> list[str]:
        """Names of the tasks that reported a change, in order, once each."""
        names: dict[str, None] = {}
        task = ""
        for line in self.result.stdout.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.split("[", 1)[1].rsplit("]", 1)[0]
            elif line.startswith("changed:"):
                names[task] = None
        return list(names)


@dataclass
class Site:
    """site.yml against one test host (or a fleet) with the sim profile and the session's
    wheelhouse."""

    host: TestHost | TestFleet
    wheelhouse: Path
    profile: Path = SIM_PROFILE
    # pdstack-finish.timer's interval (the role's default is 30 s). Each run is a Python start
    # (about 0.7 CPU-s): at 30 s, 10% of the test hosts' CPU in a whole run. The modules that
    # test the timer (test_ops_recovery, test_fleet) keep the role's 30.
    finish_interval_s: int = 600

    def run(self, *args: str, profile: Path | None = None) -> Run:
        start = time.monotonic()
        result = self.host.ansible_playbook(
            "site.yml",
            "-e", f"pdstack_profile={profile or self.profile}",
            "-e", f"pdstack_wheelhouse={self.wheelhouse}",
            "-e", f"pdstack_gateway_api_key={API_KEY}",
            "-e", f"pdstack_engine_finish_interval_s={self.finish_interval_s}",
            # No Prometheus packages on the plain test host; see test_monitoring_e2e.py
            "-e", "pdstack_monitoring=false",
            *args,
            timeout=CONVERGE_TIMEOUT,
        )  # fmt: skip
        return Run(result, time.monotonic() - start)

    def deployment(self) -> dict[str, Any]:
        return filter_plugin().pdstack_deployment(str(self.host.inventory), str(self.profile))


def build_wheelhouse(profile: Path, inventory: Path) -> Path:
    """deploy/wheelhouse.sh for the profile's packages, as site.yml would run it (cached)."""
    args = filter_plugin().pdstack_deployment(str(inventory), str(profile))["wheelhouse_args"]
    result = subprocess.run(
        [str(ROOT / "deploy" / "wheelhouse.sh"), *args],
        env={**os.environ, "PDSTACK_PYTHON": sys.executable},
        text=True, capture_output=True, timeout=1800, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return Path(result.stdout.strip())


@contextlib.contextmanager
def site_load(url: str) -> Iterator[list[Outcome]]:
    """constant_load's streaming clients through a test host's gateway (its API key)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with constant_load(url, max_tokens=LOAD_TOKENS, headers=headers) as outcomes:
        yield outcomes


def roll_under_load(site: Site, profile: Path, *args: str) -> Run:
    """site.yml with `profile` and `args` (-v: pdctl's progress lines in the output) while
    streaming clients load the first gateway; asserts the run passed and no client request
    failed."""
    url = site.deployment()["gateway"]["url"]
    with site_load(url) as outcomes:
        flowed(outcomes)
        run = site.run("-v", *args, profile=profile)
        flowed(outcomes)
    run.assert_ok()
    failed = [o.failure for o in outcomes if not o.ok]
    print(f"roll: {run.seconds:.0f}s, {len(outcomes)} requests, {len(failed)} failed")
    assert len(outcomes) > 50, len(outcomes)
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    return run


def wait_ready(url: str, timeout: float = 120) -> None:
    """Until the gateway reports a healthy prefill and decode (its /readiness)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{url}/readiness", timeout=5)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as e:
            last = str(e)
        time.sleep(1)
    pytest.fail(f"gateway {url} not ready after {timeout:.0f}s: {last}")


@pytest.fixture(scope="session", name="site")
def site_fixture(testhost: TestHost) -> Iterator[Site]:
    yield Site(testhost, build_wheelhouse(SIM_PROFILE, testhost.inventory))


def host_status(host: TestHost) -> dict[str, Any]:
    """`pdctl status --format json` on a host (its topology: the whole fleet)."""
    r = host.ssh(f"{PDCTL} status --format json", timeout=300)
    assert r.stdout, r.stderr
    result: dict[str, Any] = json.loads(r.stdout)
    return result
