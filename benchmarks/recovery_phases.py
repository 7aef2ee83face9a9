"""Where a crash recovery's time goes, without a fleet: `kill -9` of a sim decode, then
`pdctl recover`'s code path (pdctl.ops.recover.recover) over local processes
(pdctl.testing.localproc: sim engines, the real smg gateway, a real one-member etcd), each
phase timed from the kill.

benchmarks/recovery_time.py measures the same recovery on the three-host fleet, where the
engine unit's OnFailure= starts pdstack-recover@PAIR.service and `pdctl` starts in a fresh
interpreter first: `pdctl recover --help` times that start-up here (a fresh interpreter
importing the recover command, as benchmarks/cli_startup.py does for `validate`).

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pdctl.ops import recover as recover_mod
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.recover import RateLimit, RecoveryLog
from pdctl.ops.restart import register_pair
from pdctl.testing.etcd import local_etcd
from pdctl.testing.localproc import LocalPair, local_ops
from pdctl.testing.stack import SimProc, constant_load, partner_env, smg_binary, start_gateway

ROOT = Path(__file__).resolve().parents[1]
# The rehearsal fleet's sim (deploy/profiles/sim-fleet.yml): 2 s of simulated start-up at
# time scale 1.
SIM_ENV = {"PDSIM_STARTUP_DELAY_S": "2", "PDSIM_SEED": "1"}
PHASES = ("drain", "stop", "start", "health", "canary", "verify", "register")
STARTUP = ("start", "health", "canary")
ENTRY = "import sys; from pdctl.cli import main; sys.argv[0] = 'pdctl'; main()"


def cli_startup_s(runs: int) -> list[float]:
    """Wall seconds of `pdctl recover --help` in a fresh interpreter, `runs` times."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", ENTRY, "recover", "--help"],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd="/",
        )
        out.append(round(time.perf_counter() - t0, 3))
    return out


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
    (target,) = ops.source.pairs()
    began: list[float] = []
    real = recover_mod.restart_pair

    def timed_restart(*a: object, **kw: object):  # type: ignore[no-untyped-def]
        began.append(time.monotonic())
        return real(*a, **kw)  # type: ignore[arg-type]

    recover_mod.restart_pair = timed_restart  # type: ignore[assignment]
    try:
        t0 = time.monotonic()
        pair.decode.kill()
        rep = recover_mod.recover(ops, target, RateLimit(max_count=1000), log, lock_wait=60)
        t_end = time.monotonic()
    finally:
        recover_mod.restart_pair = real
    if not rep.ok:
        raise SystemExit(f"recovery failed: {rep.error}")
    deadline = time.monotonic() + 30
    while (served := watch.served_after(t0)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    row = {"lock": round(began[0] - t0, 3), **{p: rep.phases.get(p, 0.0) for p in PHASES}}
    row["after"] = round(t_end - began[0] - sum(rep.phases.values()), 3)
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
            ops.say = lambda line: None
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
    cli = cli_startup_s(a.cli_runs)
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    print(json.dumps({"median": med, "max_over": max(r["over"] for r in rows),
                      "pdctl_recover_help_s": cli}))  # fmt: skip


if __name__ == "__main__":
    main()
