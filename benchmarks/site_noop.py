"""How long a `site.yml` run that changes nothing takes, against the first run.

Boots a fresh systemd test host (deploy/testhost/testhost, as `make demo` does; run as root),
converges it with the sim profile (the first run), then runs site.yml again RUNS times with
nothing to change. Prints each run's wall time and `changed=` count, the median no-op run and
the ratio no-op / first (goal: at most 0.4). The host is taken down at the end unless
--keep; --inventory measures an already converged host (no first run, no ratio).

    .venv/bin/python benchmarks/site_noop.py [--runs 3] [--name pdbench] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTHOST = ROOT / "deploy" / "testhost" / "testhost"
STATE = Path(os.environ.get("PDSTACK_TESTHOST_STATE", ROOT / "deploy" / "testhost" / "state"))
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
TIMEOUT_S = 1800
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", re.MULTILINE)


def testhost(*args: str) -> None:
    subprocess.run([str(TESTHOST), *args], check=True, timeout=TIMEOUT_S)


def site(inventory: Path, env: dict[str, str], extra: list[str]) -> tuple[float, int]:
    """(wall s, changed tasks summed over hosts) of one site.yml run; exits on failure."""
    cmd = [str(PLAYBOOK), "site.yml", "-i", str(inventory), "-e", "pdstack_grafana_install=false"]
    start = time.perf_counter()
    run = subprocess.run(
        [*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    wall = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(f"site.yml failed (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr}")
    return wall, sum(int(m[3]) for m in RECAP.finditer(run.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="no-op runs after the first")
    parser.add_argument("--name", default="pdbench", help="test host name")
    parser.add_argument("--keep", action="store_true", help="leave the test host up")
    parser.add_argument("--inventory", type=Path, help="an already converged host instead")
    parser.add_argument(
        "--secret",
        default=secrets.token_urlsafe(18),
        help="gateway API key and Grafana password (with --inventory: the ones it has)",
    )
    opts = parser.parse_args()

    extra = [
        "-e", f"pdstack_profile={ROOT / 'deploy/profiles/sim.yml'}",
        "-e", f"pdstack_gateway_api_key={opts.secret}",
        "-e", f"pdstack_grafana_admin_password={opts.secret}",
    ]  # fmt: skip
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    inventory, booted = opts.inventory, opts.inventory is None
    if booted:
        packages = (ROOT / "deploy/testhost/monitoring-packages").read_text().strip()
        testhost("up", "--name", opts.name, "--extra-packages", packages)
        inventory = STATE / opts.name / "inventory.ini"
    assert inventory is not None
    try:
        first = site(inventory, env, extra) if booted else None
        if first:
            print(f"first run   {first[0]:7.1f} s  changed={first[1]}")
        noop = [site(inventory, env, extra) for _ in range(opts.runs)]
        for n, (wall, changed) in enumerate(noop, 1):
            print(f"no-op run {n} {wall:7.1f} s  changed={changed}")
    finally:
        if booted and not opts.keep:
            testhost("down", "--name", opts.name)
    median = statistics.median(w for w, _ in noop)
    print(f"no-op median {median:.1f} s")
    if first:
        print(f"ratio no-op / first: {median / first[0]:.2f} (goal <= 0.4)")
    if any(changed for _, changed in noop):
        sys.exit("a no-op run changed something: site.yml is not idempotent")


if __name__ == "__main__":
    main()
