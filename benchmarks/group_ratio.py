"""What the prefill:decode ratio does: the same 4 pretend GPUs as two 1P1D pairs, one 3P1D
group and one 1P3D group, under a prefill-heavy and a decode-heavy workload, and the roll
time (`restart --both`) of a group against a pair.

Each layout is deploy/profiles/sim.yml (its tuning, its sim knobs: the shipped performance
model) with 4 GPUs and the layout swapped in, loaded by the spec loader as `pdctl validate`
loads it; each engine runs as its unit would (pdctl.render's command line and environment)
as a local process, behind the real gateway (smg, the profile's policy, retries off so every
engine error reaches the client), each pair and group registered under its own pairing
protocol as pdctl registers it. The load is `pdctl bench sweep`'s builtin driver at a fixed
concurrency (bench_serving's flow: at most C in flight, failures by pdctl.bench.stream's
rule), its TTFT and ITL percentiles by pdctl.bench.metrics; output tok/s counts the tokens
made while all C were in flight (the first request sent to the last one sent). After the
workloads the layout's first pair or group is restarted once, idle, by the ops restart path
(drain, stop, start, health, canary, verify, register). `--time-scale S` runs the sim S times
slower (PDSIM_TIME_SCALE) and divides the load's measured times by S (the restart's phases
stay wall seconds). Prints figures (docs/bench.md, "Choosing the ratio"); not a test.

    .venv/bin/python benchmarks/group_ratio.py [--time-scale S] [--requests-factor F]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import yaml

from pdctl.bench.builtin import run_alone
from pdctl.bench.level import Level, Target
from pdctl.bench.metrics import calculate, window_tokens
from pdctl.ops.context import Timeouts
from pdctl.ops.restart import restart_pair
from pdctl.spec import Deployment, load_deployment
from pdctl.testing.localproc import HOST, deployed, serving
from pdctl.testing.stack import free_port, served_model

SIM_PROFILE = Path(__file__).resolve().parents[1] / "deploy" / "profiles" / "sim.yml"
GPUS = 4
# (prefills, decodes) of each pair or group; a 1P1D unit is written as a pair, as users do.
LAYOUTS: dict[str, tuple[tuple[int, int], ...]] = {
    "2x1P1D": ((1, 1), (1, 1)),
    "3P1D": ((3, 1),),
    "1P3D": ((1, 3),),
}
# Tolerant health checks: one slow /health on a loaded 2-core machine must not empty the pool.
HEALTH_ARGS = ("--disable-retries", "--health-failure-threshold", "5",
               "--health-check-timeout-secs", "10")  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int  # prompts and outputs uniform in [len * range_ratio, len] (bench_serving)
    output_len: int
    range_ratio: float
    concurrency: int
    requests: int


WORKLOADS = (
    # 3000-4000 prompt tokens, 24-32 out. A prefill takes ~180 ms of the model's time, so every
    # layout serves at most ~17 requests/s while a request lasts over a second: 32 in flight
    # keep every prefill busy in every layout.
    Workload("prefill-heavy", 4000, 32, 0.75, 32, 240),
    # 100-200 prompt tokens, 256-512 out. 96 in flight = 1.5 decodes' worth of
    # max_running_requests (64): more than one decode holds, 48 or 32 a decode for two or three.
    Workload("decode-heavy", 200, 512, 0.5, 96, 192),
)


def ratio_profile(shape: tuple[tuple[int, int], ...], ports: Iterator[int]) -> dict[str, Any]:
    """sim.yml on a 4-GPU host with one TP1 engine a GPU, laid out as `shape`; ports drawn
    from `ports`."""
    profile = yaml.safe_load(SIM_PROFILE.read_text())
    profile["hardware"] |= {"gpu_count": GPUS, "numa_gpus": {0: list(range(GPUS))}}
    gpus = count()

    def member(role: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"numa_node": 0, "gpus": [next(gpus)], "port": next(ports)}
        return spec | ({"bootstrap_port": next(ports)} if role == "prefill" else {})

    if all(unit == (1, 1) for unit in shape):
        pairs = [{"name": f"pd{n}", "prefill": member("prefill"), "decode": member("decode")}
                 for n in range(len(shape))]  # fmt: skip
        profile["layout"] = {"pairs": pairs}
    else:
        groups = [{"name": f"g{n}", "prefill": [member("prefill") for _ in range(p)],
                   "decode": [member("decode") for _ in range(d)]}
                  for n, (p, d) in enumerate(shape)]  # fmt: skip
        profile["layout"] = {"groups": groups}
    return profile


def load_layout(profile: dict[str, Any], root: Path) -> Deployment:
    """The profile on the pretend host `local` (127.0.0.1), through the spec loader."""
    root.mkdir()
    (root / "profile.yml").write_text(yaml.safe_dump(profile, sort_keys=False))
    inventory = root / "inventory.ini"
    inventory.write_text(
        f"[pd_hosts]\n{HOST} ansible_host=127.0.0.1\n\n[router]\n{HOST}\n\n"
        "[all:vars]\npdstack_profile=profile.yml\n"
    )
    return load_deployment(inventory)


def measure(url: str, w: Workload, scale: float, factor: float) -> dict[str, float]:
    level = Level(w.concurrency, round(w.requests * factor), w.input_len, w.output_len,
                  w.range_ratio, seed=1)  # fmt: skip
    outputs, start, _ = asyncio.run(run_alone(Target(url, served_model(url), "chat"), level))
    for o in outputs:
        if not o.success:
            print(f"  {w.name}: failed: {o.error}", file=sys.stderr)
    result = calculate(outputs, 1.0)  # its percentiles; the throughput is the window's
    last_sent = max(o.start_time for o in outputs)
    tokens = window_tokens(outputs, start, last_sent)
    return {
        "requests": len(outputs),
        "failed": sum(not o.success for o in outputs),
        "out_tok_s": tokens / (last_sent - start) * scale,
        "ttft_p50": result["median_ttft_ms"] / scale,
        "ttft_p90": result["p90_ttft_ms"] / scale,
        "itl_p50": result["median_itl_ms"] / scale,
        "itl_p90": result["p90_itl_ms"] / scale,
    }


def run_layout(name: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both workloads (a table row each, printed), then a restart of the first pair or group:
    its id, shape and phase times."""
    profile = ratio_profile(LAYOUTS[name], iter(free_port, None))
    profile["sim"]["PDSIM_TIME_SCALE"] = args.time_scale
    dep = load_layout(profile, root / name)
    timeouts = Timeouts(health=120 * args.time_scale, canary=60 * args.time_scale, poll=0.1)
    gateway_args = ("--policy", dep.profile.router.policy, *HEALTH_ARGS)
    with serving(deployed(dep, root), root, *gateway_args, timeouts=timeouts) as (ops, _, gw):
        for w in WORKLOADS:
            row = measure(gw.url, w, args.time_scale, args.requests_factor)
            print(table_row(name, w, row), flush=True)
        ops.say = lambda _line: None
        unit = ops.source.pairs()[0]
        rep = restart_pair(ops, unit)
    if not rep.ok:
        raise SystemExit(f"restart --both --pair {unit.id} failed: {rep.error}")
    return {"unit": unit.id, "shape": f"{len(unit.prefills)}P{len(unit.decodes)}D",
            "phases": rep.phases}  # fmt: skip


def table_row(layout: str, w: Workload, r: dict[str, float]) -> str:
    return (
        f"{layout:7} {w.name:14} {w.concurrency:>3} {r['requests']:>5.0f} {r['failed']:>6.0f} "
        f"{r['out_tok_s']:>9.0f} {r['ttft_p50']:>8.0f} {r['ttft_p90']:>8.0f} "
        f"{r['itl_p50']:>7.1f} {r['itl_p90']:>7.1f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=1.0, help="PDSIM_TIME_SCALE")
    ap.add_argument("--requests-factor", type=float, default=1.0,
                    help="each workload's request count times this")  # fmt: skip
    args = ap.parse_args()
    # a SIGTERM unwinds through the finally blocks that stop the engines and the gateway
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = len(LAYOUTS) * len(WORKLOADS)
    print(f"{len(LAYOUTS)} layouts x {len(WORKLOADS)} workloads = {runs} runs, "
          f"then {len(LAYOUTS)} restarts; time scale {args.time_scale:g}", flush=True)  # fmt: skip
    print(f"{'layout':7} {'workload':14} {'C':>3} {'reqs':>5} {'failed':>6} {'out tok/s':>9} "
          f"{'TTFT p50':>8} {'TTFT p90':>8} {'ITL p50':>7} {'ITL p90':>7}   (ms)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pdctl-group-ratio-") as tmp:
        rolls = [run_layout(name, Path(tmp), args) for name in LAYOUTS]
    print("\nrestart --both of one pair or group, idle (wall seconds):")
    for roll in rolls:
        phases = roll["phases"]
        steps = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
        print(f"  {roll['shape']} {roll['unit']:10} {sum(phases.values()):5.2f}: {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
