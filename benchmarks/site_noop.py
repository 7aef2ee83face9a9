"""How long a `site.yml` run that changes nothing takes, against the first run, and where the
time goes.

Boots a fresh systemd test host (deploy/testhost/testhost, as `make demo` does; run as root) or
with --fleet a fleet of --size hosts (sim-fleet profile, as `make demo-fleet`), converges it
(the first run), then runs site.yml again RUNS times with nothing to change. Prints each run's
wall time and `changed=` count, the median no-op run and the ratio no-op / first (goal: at most
0.35), and, from callback_plugins/pdstack_timing.py, the time per role and per module (action),
the remote round trips per host (module executions, commands sent, file transfers), the parses
of the deployment (every `load_deployment`: the filter plugin's deployment fact, and the
preflight's validate; benchmarks/parse_count.py) and the slowest tasks, for the first run and
the median no-op run.
The hosts are taken down at the end unless --keep; --inventory measures an already converged
deployment (no first run, no ratio).

    .venv/bin/python benchmarks/site_noop.py [--runs 3] [--name pdbench] [--keep]
    .venv/bin/python benchmarks/site_noop.py --fleet pdbf --size 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTHOST = ROOT / "deploy" / "testhost" / "testhost"
STATE = Path(os.environ.get("PDSTACK_TESTHOST_STATE", ROOT / "deploy" / "testhost" / "state"))
# The ansible-playbook next to this Python (the project venv's).
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
PARSE_COUNT = ROOT / "benchmarks" / "parse_count.py"  # runs it, counting the deployment's parses
TIMEOUT_S = 1800
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", re.MULTILINE)
KINDS = ("modules", "commands", "transfers")


@dataclass
class Run:
    wall: float
    cpu: float  # user + system seconds of ansible-playbook and its workers (the controller's)
    changed: int
    timing: dict[str, Any]
    parses: list[str]  # one pid per parse of the deployment (benchmarks/parse_count.py)

    def summary(self) -> str:
        return f"{self.wall:7.1f} s  controller cpu {self.cpu:6.1f} s  changed={self.changed}"

    def seconds_by(self, key: str) -> dict[str, float]:
        """Task seconds summed per role or per action (module)."""
        out: defaultdict[str, float] = defaultdict(float)
        for task in self.timing["tasks"]:
            out[task[key] or "(play)"] += task["seconds"]
        return dict(out)


def testhost(*args: str) -> None:
    subprocess.run([str(TESTHOST), *args], check=True, timeout=TIMEOUT_S)


def site(inventory: Path, extra: list[str], scratch: Path, n: int) -> Run:
    """One site.yml run with the timing callback; exits on failure."""
    timing, parses = scratch / f"run{n}.json", scratch / f"run{n}.parses"
    env = dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACKS_ENABLED="pdstack_timing",
        PDSTACK_TIMING_FILE=str(timing),
    )
    cmd = [sys.executable, str(PARSE_COUNT), str(parses), str(PLAYBOOK), "site.yml"]
    cmd += ["-i", str(inventory), "-e", "pdstack_grafana_install=false"]
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(
        [*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if run.returncode != 0:
        sys.exit(f"site.yml failed (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr}")
    changed = sum(int(m[3]) for m in RECAP.finditer(run.stdout))
    pids = parses.read_text().split() if parses.exists() else []
    return Run(wall, cpu, changed, json.loads(timing.read_text()), pids)


def report(runs: dict[str, Run], top: int) -> None:
    """Per role, round trips per host, parses, and the slowest tasks of each run."""
    names = list(runs)
    for key in ("role", "action"):
        print(f"\n{key:28}" + "".join(f"{n:>12}" for n in names))
        totals = [run.seconds_by(key) for run in runs.values()]
        rows = dict.fromkeys(r for t in totals for r in t)
        if key == "action":  # the costliest modules first
            rows = dict.fromkeys(sorted(rows, key=lambda r: -totals[-1].get(r, 0.0)))
        for row in rows:
            label = row.removeprefix("ansible.builtin.")
            print(f"{label:28}" + "".join(f"{t.get(row, 0.0):11.1f}s" for t in totals))
    print(f"{'all tasks':28}" + "".join(f"{run.timing['seconds']:11.1f}s" for run in runs.values()))

    print(f"\n{'round trips by target':28}" + "".join(f"{n:>24}" for n in names))
    print(f"{'':28}" + f"{'modules/commands/files':>24}" * len(names))
    targets = dict.fromkeys(t for run in runs.values() for t in run.timing["calls"])
    for target in targets:
        cells = ""
        for run in runs.values():
            c = run.timing["calls"].get(target, dict.fromkeys(KINDS, 0))
            cells += f"{'/'.join(str(c[k]) for k in KINDS):>24}"
        print(f"{target:28}{cells}")

    print(f"\n{'deployment parses':28}" + "".join(
        f"{len(r.parses):>5} in {len(set(r.parses))} processes" for r in runs.values()
    ))  # fmt: skip

    for name, run in runs.items():
        print(f"\nslowest tasks, {name}: seconds, modules/commands/files")
        for task in sorted(run.timing["tasks"], key=lambda t: -t["seconds"])[:top]:
            calls = "/".join(str(task["calls"][k]) for k in KINDS)
            print(f"  {task['seconds']:6.2f}  {calls:>9}  {task['name']}")
        counts = Counter(t["role"] or "(play)" for t in run.timing["tasks"])
        print(f"  tasks run: {sum(counts.values())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="no-op runs after the first")
    parser.add_argument("--name", default="pdbench", help="test host name")
    parser.add_argument("--fleet", help="boot a fleet of this name instead of one host")
    parser.add_argument("--size", type=int, default=2, help="hosts in the --fleet")
    parser.add_argument("--keep", action="store_true", help="leave the test hosts up")
    parser.add_argument("--inventory", type=Path, help="an already converged deployment instead")
    parser.add_argument("--top", type=int, default=15, help="slowest tasks listed per run")
    parser.add_argument(
        "--secret",
        default=secrets.token_urlsafe(18),
        help="gateway API key and Grafana password (with --inventory: the ones it has)",
    )
    opts = parser.parse_args()

    profile = ROOT / "deploy" / "profiles" / ("sim-fleet.yml" if opts.fleet else "sim.yml")
    extra = [
        "-e", f"pdstack_profile={profile}",
        "-e", f"pdstack_gateway_api_key={opts.secret}",
        "-e", f"pdstack_grafana_admin_password={opts.secret}",
    ]  # fmt: skip
    inventory, booted = opts.inventory, opts.inventory is None
    if booted:
        packages = (ROOT / "deploy/testhost/monitoring-packages").read_text().strip()
        if opts.fleet:
            testhost("fleet-up", "--fleet", opts.fleet, "--size", str(opts.size),
                     "--extra-packages", packages)  # fmt: skip
        else:
            testhost("up", "--name", opts.name, "--extra-packages", packages)
        inventory = STATE / (opts.fleet or opts.name) / "inventory.ini"
    assert inventory is not None
    with tempfile.TemporaryDirectory(prefix="site-noop-") as tmp:
        scratch = Path(tmp)
        try:
            first = site(inventory, extra, scratch, 0) if booted else None
            if first:
                print(f"first run   {first.summary()}")
            noop = [site(inventory, extra, scratch, n) for n in range(1, opts.runs + 1)]
            for n, run in enumerate(noop, 1):
                print(f"no-op run {n} {run.summary()}")
        finally:
            if booted and not opts.keep:
                if opts.fleet:
                    testhost("fleet-down", "--fleet", opts.fleet)
                else:
                    testhost("down", "--name", opts.name)
    median = statistics.median_low(r.wall for r in noop)
    print(f"no-op median {median:.1f} s")
    if first:
        print(f"ratio no-op / first: {median / first.wall:.2f} (goal <= 0.35)")
    middle = next(r for r in noop if r.wall == median)
    report({**({"first": first} if first else {}), "no-op": middle}, opts.top)
    if any(r.changed for r in noop):
        sys.exit("a no-op run changed something: site.yml is not idempotent")


if __name__ == "__main__":
    main()
