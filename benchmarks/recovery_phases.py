"""Where a crash recovery's time goes, without a fleet: `kill -9` of a sim decode, then
`pdctl recover`'s code path (pdctl.ops.recover.recover) over local processes
(pdctl.testing.localproc: sim engines, the real smg gateway, a real one-member etcd), each
phase timed from the kill.

benchmarks/recovery_time.py measures the same recovery on the three-host fleet, where the
engine unit's OnFailure= starts pdstack-recover@PAIR.service and `pdctl` starts in a fresh
interpreter first: `pdctl recover --help` times that start-up here (a fresh interpreter
importing the recover command, timed as benchmarks/cli_startup.py times `validate`).

Per kill: `lock` (the kill until restart_pair begins: the rate-limit state, the host flock,
the fleet lock's lease, the history record), the restart's own phases (drain, stop, start,
health, canary, verify, register), `served` (the kill until the gateway lists both engines
ready again, sampled every 20 ms) and `over` (served less the pair's start-up: start +
health + canary, as recovery_time.py counts it). Under constant streaming load through the
gateway (--clients).

    .venv/bin/python benchmarks/recovery_phases.py [--kills 5] [--clients 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from cli_startup import run as cli_startup_run

from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.recover import RateLimit, RecoveryLog, recover
from pdctl.ops.restart import register_pair
from pdctl.testing.etcd import local_etcd
from pdctl.testing.localproc import LocalPair, local_ops
from pdctl.testing.stack import SimProc, constant_load, partner_env, smg_binary, start_gateway

# The rehearsal fleet's sim (deploy/profiles/sim-fleet.yml): 2 s of simulated start-up at
# time scale 1.
SIM_ENV = {"PDSIM_STARTUP_DELAY_S": "2", "PDSIM_SEED": "1"}
PHASES = ("drain", "stop", "start", "health", "canary", "verify", "register")
STARTUP = ("start", "health", "canary")


def cli_startup(runs: int) -> dict[str, list[float]]:
    """`pdctl recover --help` in a fresh interpreter, `runs` times: wall and CPU seconds."""
    got = [cli_startup_run(["recover", "--help"])[:2] for _ in range(runs)]
    return {"wall_s": [round(w, 3) for w, _ in got], "cpu_s": [round(c, 3) for _, c in got]}


class ServedWatch:
    """The gateway's /workers every 20 ms: when both of `urls` are listed ready again."""

    def __init__(self, ops: Ops, urls: set[str]) -> None:
        self.gw, self.urls = ops.gateways[0], urls
        self.samples: list[tuple[float, bool]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                ws = self.gw.workers()
                ready = self.urls <= {w.url for w in ws if w.healthy and w.status == "ready"}
            except Exception:  # a sample lost; the next one counts
                continue
            self.samples.append((time.monotonic(), ready))
            self.done.wait(0.02)

    def served_after(self, t0: float) -> float | None:
        down = False
        for t, ready in list(self.samples):
            if t < t0:
                continue
            if not ready:
                down = True
            elif down:
                return t
        return None

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


def one_kill(ops: Ops, pair: LocalPair, log: RecoveryLog, watch: ServedWatch) -> dict[str, float]:
    """kill -9 of the decode, then the recovery; its phases (s), from its progress lines'
    times and its report."""
    (target,) = ops.source.pairs()
    said: list[tuple[float, str]] = []
    ops.say = lambda line: said.append((time.monotonic(), line))
    t0 = time.monotonic()
    pair.decode.kill()
    rep = recover(ops, target, RateLimit(max_count=1000), log, lock_wait=60)
    t_end = time.monotonic()
    if not rep.ok:
        raise SystemExit(f"recovery failed: {rep.error}")
    # restart_pair's first line: the lock is held and the rate limit admitted it.
    began = next(t for t, line in said if line.startswith(f"{target.id}: restarting "))
    deadline = time.monotonic() + 30
    while (served := watch.served_after(t0)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    row = {"lock": round(began - t0, 3), **{p: rep.phases.get(p, 0.0) for p in PHASES}}
    row["after"] = round(t_end - began - sum(rep.phases.values()), 3)
    row["served"] = round((served or float("nan")) - t0, 3)
    row["startup"] = round(sum(rep.phases[p] for p in STARTUP), 3)
    row["over"] = round(row["served"] - row["startup"], 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--clients", type=int, default=2, help="streaming clients (0: none)")
    ap.add_argument("--cli-runs", type=int, default=5)
    a = ap.parse_args()
    binary = smg_binary()
    if binary is None:
        raise SystemExit("smg is not installed: scripts/setup.sh")
    with tempfile.TemporaryDirectory() as tmp, local_etcd(Path(tmp) / "etcd") as etcd:
        work = Path(tmp)
        prefill = SimProc.create("prefill", work, SIM_ENV).start()
        decode = SimProc.create("decode", work, {**SIM_ENV, **partner_env(prefill)}).start()
        prefill.wait_healthy(60)
        decode.wait_healthy(60)
        gw = start_gateway(binary, [], [], work, "--policy", "round_robin")
        pair = LocalPair("pd0", prefill, decode)
        try:
            ops, _ = local_ops([pair], gw, Timeouts(), coord=etcd.coord)
            (target,) = ops.source.pairs()
            register_pair(ops, target)
            gw.wait_ready()
            watch = ServedWatch(ops, {i.url for i in target.instances})
            log = RecoveryLog(work / "state" / "recover.json")
            rows = []
            load = constant_load(gw.url, clients=a.clients) if a.clients else None
            with load or contextlib.nullcontext():
                for _ in range(a.kills):
                    time.sleep(2.0)  # load on the pair again before the next kill
                    rows.append(one_kill(ops, pair, log, watch))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            watch.stop()
        finally:
            gw.stop()
            for sim in (prefill, decode):
                sim.stop(5)
    cli = cli_startup(a.cli_runs)
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    print(json.dumps({"median": med, "max_over": max(r["over"] for r in rows),
                      "pdctl_recover_help": cli}))  # fmt: skip


if __name__ == "__main__":
    main()
