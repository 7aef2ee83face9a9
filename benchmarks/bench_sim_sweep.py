"""`pdctl bench sweep` against a simulated PD pair behind the real gateway, before/after.

Replays the seed's graph-size incident without GPUs: a decode with CUDA graphs up to 32
(batches above run eager, PDSIM_EAGER_PENALTY slower) against one with graphs up to 96, each
swept at C = 1, 16, 64 through `smg --pd-disaggregation`. Writes before/after JSON lines and
PNGs into --out (docs/img/ holds the committed ones) and prints the tables and the
comparison. The engines and the gateway are local processes stopped by PID.

    .venv/bin/python benchmarks/bench_sim_sweep.py --out /tmp/bench-sample
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from pdctl.testing.stack import Gateway, SimProc, smg_binary, start_gateway

GRAPH_MAX = {"before": "32", "after": "96"}
ENGINE_ARGS = ("--mem-fraction-static", "0.60", "--context-length", "8192",
               "--max-running-requests", "128")  # fmt: skip


def sweep(name: str, out: Path, args: argparse.Namespace, logs: Path) -> None:
    env = {"PDSIM_STARTUP_DELAY_S": "1", "PDSIM_TIME_SCALE": "1"}
    extra = (*ENGINE_ARGS, "--cuda-graph-max-bs-decode", GRAPH_MAX[name])
    sims = [SimProc.create(mode, logs, env, extra=extra) for mode in ("prefill", "decode")]
    gateway: Gateway | None = None
    try:
        for sim in sims:
            sim.start().wait_healthy(60)
        binary = smg_binary()
        assert binary is not None
        gateway = start_gateway(binary, sims[:1], sims[1:], logs, "--disable-retries")
        gateway.wait_ready()
        pdctl = str(Path(sys.executable).with_name("pdctl"))
        cmd = [pdctl, "bench", "sweep", "--url", gateway.url,
               "--metrics-url", sims[1].url + "/metrics",
               "--concurrency", args.concurrency, "--input-len", "256",
               "--output-len", str(args.output_len),
               "--output-file", str(out / f"{name}.jsonl"),
               "--plot", str(out / f"{name}.png")]  # fmt: skip
        print(f"## {name}: --cuda-graph-max-bs-decode {GRAPH_MAX[name]}", flush=True)
        subprocess.run(cmd, check=True)
    finally:
        if gateway is not None:
            gateway.stop()
        for sim in sims:
            sim.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    if smg_binary() is None:
        print("smg is not installed (scripts/setup.sh installs it into .venv)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pdctl-bench-sample-") as tmp:
        for name in GRAPH_MAX:
            sweep(name, args.out, args, Path(tmp))
    pdctl = str(Path(sys.executable).with_name("pdctl"))
    subprocess.run(
        [pdctl, "bench", "compare", str(args.out / "before.jsonl"), str(args.out / "after.jsonl")],
        check=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
