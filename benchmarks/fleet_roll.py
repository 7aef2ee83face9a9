"""Rolling a config change over the fleet under constant load: failed requests, capacity
during the roll, and roll time against N x the slowest pair restart (docs/restart.md).

Needs the fleet rehearsal up and converged (`make demo-fleet`, docs/testhost.md). Sets
`engine.common.context_length` to --context-length (every pair's env file changes; the fleet
stays on it: give another value for the next run), then either
- `--mode coordinated`: `site.yml` rolls it: pdctl's coordinated restart, pair by pair; or
- `--mode all-at-once`: the old handler's behaviour, for contrast: site.yml writes the files
  with `pdstack_engine_restart_on_change=false`, then every pair target is restarted at once
  with `systemctl restart` on every host (no drain, no canary).
Meanwhile streaming chat clients count failures by pdctl's rule (pdctl/bench/stream.py) and a
sampler polls every gateway's /workers: a pair is routable when its prefill and decode are
both held healthy and ready. A pair's restart is the span it was not routable at the first
gateway.

    .venv/bin/python benchmarks/fleet_roll.py -i deploy/testhost/state/pdfleet/inventory.ini \\
        -p deploy/profiles/sim-fleet.yml --api-key-file deploy/testhost/state/demo-api-key
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pdctl import names, topology
from pdctl.ops.gateway import GatewayAdmin, GatewayError, ready
from pdctl.spec import load_deployment
from pdctl.testing.stack import constant_load

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.25


@dataclass
class Capacity:
    """Per sample: seconds since start and the routable pairs at each gateway."""

    samples: list[tuple[float, list[set[str]]]] = field(default_factory=list)

    def min_fraction(self, n_pairs: int) -> float:
        seen = [len(r) for _, per_gw in self.samples for r in per_gw]
        return min(seen, default=0) / n_pairs

    def outages(self, pair: str) -> list[tuple[float, float]]:
        """Spans (start, end) the pair was not routable at the first gateway."""
        spans: list[tuple[float, float]] = []
        start = None
        for t, per_gw in self.samples:
            up = pair in per_gw[0]
            if not up and start is None:
                start = t
            elif up and start is not None:
                spans.append((start, t))
                start = None
        if start is not None:
            spans.append((start, self.samples[-1][0]))
        return spans


def sample(
    gateways: list[GatewayAdmin], pairs: dict[str, list[str]], stop: threading.Event
) -> Capacity:
    cap = Capacity()
    t0 = time.monotonic()

    def run() -> None:
        while not stop.is_set():
            per_gw = []
            for gw in gateways:
                try:
                    ws = gw.workers()
                except GatewayError:
                    ws = []
                per_gw.append({p for p, urls in pairs.items() if ready(urls)(ws)})
            cap.samples.append((time.monotonic() - t0, per_gw))
            stop.wait(SAMPLE_S)

    threading.Thread(target=run, daemon=True).start()
    return cap


def playbook(inventory: Path, profile: Path, api_key: str, *extra: str) -> None:
    cmd = [
        str(ROOT / ".venv/bin/ansible-playbook"),
        str(ROOT / "site.yml"),
        "-i",
        str(inventory),
        "-e",
        f"pdstack_profile={profile}",
        "-e",
        f"pdstack_gateway_api_key={api_key}",
        "-e",
        "pdstack_monitoring=false",
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"site.yml failed (exit {r.returncode}):\n{r.stdout[-3000:]}")


def restart_all_at_once(inventory: Path, targets: list[str]) -> None:
    r = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible"),
            "pd_hosts",
            "-i",
            str(inventory),
            "-f",
            "10",
            "-m",
            "ansible.builtin.command",
            "-a",
            "systemctl restart " + " ".join(targets),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    if r.returncode:
        raise SystemExit(f"systemctl restart failed:\n{r.stdout[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", type=Path, required=True)
    ap.add_argument("-p", "--profile", type=Path, required=True)
    ap.add_argument("--api-key-file", type=Path, required=True)
    ap.add_argument("--mode", choices=["coordinated", "all-at-once"], default="coordinated")
    ap.add_argument("--context-length", type=int, default=4096, help="the changed value")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--settle", type=float, default=60.0, help="max s to wait for recovery")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    api_key = a.api_key_file.read_text().strip()
    a.profile = a.profile.resolve()  # site.yml resolves a relative one against the inventory
    dep = load_deployment(a.inventory, a.profile)
    topo = topology.from_deployment(dep)
    urls = {i.id: i.url for i in topo.instances}
    pairs = {f"{p.host}/{p.name}": [urls[p.prefill], urls[p.decode]] for p in topo.pairs}
    gateways = [GatewayAdmin(g.url, api_key) for g in topo.gateways]

    profile = yaml.safe_load(a.profile.read_text())
    profile["engine"]["common"]["context_length"] = a.context_length
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=a.profile.parent) as changed:
        yaml.safe_dump(profile, changed, sort_keys=False)
        changed.flush()
        stop = threading.Event()
        headers = {"Authorization": f"Bearer {api_key}"}
        with constant_load(topo.gateways[0].url, clients=a.clients, headers=headers) as outcomes:
            cap = sample(gateways, pairs, stop)
            time.sleep(3)
            t0 = time.monotonic()
            if a.mode == "coordinated":
                playbook(a.inventory, Path(changed.name), api_key)
            else:
                playbook(
                    a.inventory,
                    Path(changed.name),
                    api_key,
                    "-e",
                    "pdstack_engine_restart_on_change=false",
                )
                restart_all_at_once(
                    a.inventory, sorted({names.pair_target(p.name) for p in topo.pairs})
                )
                # Without drain/register, wait for the gateway's health checks to re-admit.
                deadline = time.monotonic() + a.settle
                while time.monotonic() < deadline and not (
                    cap.samples and len(cap.samples[-1][1][0]) == len(pairs)
                ):
                    time.sleep(SAMPLE_S)
            command_s = time.monotonic() - t0
            time.sleep(3)
            stop.set()

    spans = {p: cap.outages(p) for p in pairs}
    restart_s = {p: round(sum(e - s for s, e in sp), 2) for p, sp in spans.items()}
    starts = [s for sp in spans.values() for s, _ in sp]
    ends = [e for sp in spans.values() for _, e in sp]
    roll_s = max(ends) - min(starts) if starts else 0.0
    slowest = max(restart_s.values(), default=0.0)
    failed = [o.failure for o in outcomes if not o.ok]
    result = {
        "mode": a.mode,
        "pairs": len(pairs),
        "hosts": len({p.host for p in topo.pairs}),
        "gateways": len(gateways),
        "requests": len(outcomes),
        "failed": len(failed),
        "failures": failed[:5],
        "min_routable_fraction": round(cap.min_fraction(len(pairs)), 3),
        "pair_unroutable_s": restart_s,
        "roll_s": round(roll_s, 2),
        "command_s": round(command_s, 2),
        "roll_over_n_x_slowest": round(roll_s / (len(pairs) * slowest), 3) if slowest else None,
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        print(f"{k:>24}: {v}")


if __name__ == "__main__":
    main()
