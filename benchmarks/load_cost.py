"""What the tests' streaming load costs in CPU: constant_load's closed-loop clients through the
real gateway to a local sim pair, for each `max_tokens` asked.

Prints, per `max_tokens`, the requests per second and the CPU seconds per wall second of the
prefill, the decode, smg and the clients (this process), and the CPU per request. The e2e
rolls run under this load for minutes on a machine whose cores are already busy, so what the
load burns is taken from the restarts it watches (tests/e2e/fixtures_site.py, LOAD_TOKENS).

    .venv/bin/python benchmarks/load_cost.py [--seconds 30] [--tokens 8 32 64]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from pdctl.testing.stack import SimProc, constant_load, smg_binary, start_gateway


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30, help="load time per max_tokens")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 32, 64], help="max_tokens")
    ap.add_argument("--clients", type=int, default=4, help="closed-loop clients (the tests' 4)")
    a = ap.parse_args()
    binary = smg_binary()
    if binary is None:
        sys.exit("smg is not installed: run scripts/setup.sh")
    logs = Path(tempfile.mkdtemp(prefix="load-cost-"))
    env = {"PDSIM_STARTUP_DELAY_S": "0"}
    prefill = SimProc.create("prefill", logs, env)
    decode = SimProc.create("decode", logs, env)
    gw = None
    try:  # from the first start on: an engine or gateway that fails to come up stops the rest
        for sim in (prefill, decode):
            sim.start()
        for sim in (prefill, decode):
            sim.wait_healthy()
        gw = start_gateway(binary, [prefill], [decode], logs, "--disable-retries").wait_ready()
        procs = {"prefill": prefill.proc, "decode": decode.proc, "smg": gw.proc}
        print(f"{a.clients} clients, {a.seconds:.0f} s each; CPU s per wall s (logs: {logs})")
        print("max_tokens  req/s  failed  prefill  decode    smg  clients  total  ms/request")
        for tokens in a.tokens:
            before = {k: cpu_of(p.pid) for k, p in procs.items() if p}
            mine, t0 = own_cpu(), time.monotonic()
            with constant_load(gw.url, a.clients, tokens, timeout=30) as outcomes:
                time.sleep(a.seconds)
            wall = time.monotonic() - t0
            used = {k: cpu_of(p.pid) - before[k] for k, p in procs.items() if p}
            used["clients"] = own_cpu() - mine
            total = sum(used.values())
            failed = sum(not o.ok for o in outcomes)
            print(
                f"{tokens:>10} {len(outcomes) / wall:>6.1f} {failed:>7} "
                + " ".join(f"{used[k] / wall:>7.3f}" for k in ("prefill", "decode", "smg"))
                + f" {used['clients'] / wall:>8.3f} {total / wall:>6.3f}"
                + f" {1000 * total / max(len(outcomes), 1):>11.1f}"
            )
    finally:
        if gw is not None:
            gw.stop()
        for sim in (prefill, decode):
            sim.stop()


if __name__ == "__main__":
    main()
