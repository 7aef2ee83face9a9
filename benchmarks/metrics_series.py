"""Prometheus series per scrape target, for the fleet-growth figures in docs/performance.md:
a sim prefill's and decode's /metrics (SGLang's names and buckets), the gateway's (smg) with 1
and with --pairs pairs registered, and the node exporter's, with its per-CPU share.

Local processes (benchmarks/restart_both.py's stack: sim pairs behind the real smg), after a
few seconds of streaming load so that labelled histograms exist. Run it under the
integration lock: it takes loopback ports.

    .venv/bin/python benchmarks/metrics_series.py [--pairs 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests
from restart_both import stack

from pdctl.testing.stack import constant_load, free_port


def series(url: str) -> list[str]:
    """The sample lines of a /metrics page (one per series)."""
    text = requests.get(url, timeout=10).text
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def gateway_series(pairs: int) -> tuple[int, int, int, int]:
    """Series at a prefill, a decode and the gateway, `pairs` sim pairs registered, after load;
    and the bytes of the gateway's `GET /workers` (what the roll reads before each group)."""
    args = argparse.Namespace(prefill_startup=0.0, decode_startup=0.0)
    with tempfile.TemporaryDirectory() as d, stack(pairs, args, Path(d)) as (local, gw):
        with constant_load(gw.url, clients=2, max_tokens=16, timeout=30) as outcomes:
            time.sleep(5)
        assert outcomes and all(o.ok for o in outcomes), "requests failed: no figure"
        return (
            len(series(f"{local[0].prefill.url}/metrics")),
            len(series(f"{local[0].decode.url}/metrics")),
            len(series(f"http://127.0.0.1:{gw.metrics_port}/metrics")),
            len(requests.get(f"{gw.url}/workers", timeout=10).content),
        )


def node_exporter() -> tuple[int, int] | None:
    """(series, series with a cpu label) of the node exporter's defaults on this machine."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        return None
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                lines = series(f"http://127.0.0.1:{port}/metrics")
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return len(lines), sum('cpu="' in line for line in lines)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    prefill, decode, gw_one, list_one = gateway_series(1)
    _, _, gw_many, list_many = gateway_series(args.pairs)
    print(f"sim prefill /metrics: {prefill} series; sim decode: {decode}")
    per_worker = (gw_many - gw_one) / (2 * (args.pairs - 1))
    print(
        f"smg /metrics: {gw_one} with 1 pair, {gw_many} with {args.pairs} "
        f"({per_worker:.1f} per worker)"
    )
    per_listed = (list_many - list_one) / (2 * (args.pairs - 1))
    print(
        f"smg GET /workers: {list_one} bytes with 1 pair, {list_many} with {args.pairs} "
        f"({per_listed:.0f} per worker)"
    )
    node = node_exporter()
    if node is not None:
        total, per_cpu = node
        cpus = os.cpu_count() or 1
        print(
            f"node exporter (defaults, {cpus} CPUs): {total} series, {per_cpu} with a cpu label "
            f"({per_cpu / cpus:.0f} per CPU)"
        )


if __name__ == "__main__":
    main()
