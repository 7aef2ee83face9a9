"""Downtime of `pdctl restart --both` for one pair, next to its lower bound and a naive
sequential restart, and failed client requests and cross-group KV transfers while `--all`
rolls two pairs under load.

Local processes: sim engines (real wall-clock time, startup delays 8 s prefill and 12 s
decode by default) behind the real gateway (smg, round_robin, retries disabled so every
engine error reaches the client); systemd is stood in for by pdctl.testing.localproc
(start/stop by PID). Downtime runs from the first stop to the first successful request
through the pair's PD path; its lower bound is the slower startup. The load is streamed chat
completions judged by pdctl.bench.stream (a request fails on a non-200 status, an in-band
error, a missing finish reason or a short stream). The roll runs twice: with the workers
registered the way pdctl registers them (each pair bound by smg's pairing protocol), and,
for contrast, listed on smg's command line (unbound, as the gateway unit starts them today).
Prints figures; it is not a pass/fail test.

    .venv/bin/python benchmarks/restart_both.py [--prefill-startup 8] [--decode-startup 12]
                                                [--clients 4] [--rolls 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pdctl.ops.context import Timeouts
from pdctl.ops.restart import restart_pair, restart_pairs
from pdctl.ops.source import Pair
from pdctl.pdclient import group_canary
from pdctl.testing.localproc import LocalPair, LocalUnits, local_ops, serving
from pdctl.testing.stack import (
    Gateway,
    SimProc,
    constant_load,
    cross_group_transfers,
    partner_env,
    smg_binary,
    start_gateway,
)

# As deployed (round_robin), but every engine failure reaches the client.
GATEWAY_ARGS = ("--policy", "round_robin", "--disable-retries")


def first_success(pair: Pair, timeout: float = 120.0) -> float:
    """Monotonic time of the first request that passes through the pair's PD path."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if group_canary(pair.canary_legs(), timeout=10).ok:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError("the pair never served a request")


@contextmanager
def stack(
    n_pairs: int, args: argparse.Namespace, log_dir: Path, bound: bool = True
) -> Iterator[tuple[list[LocalPair], Gateway]]:
    """Sim pairs behind smg: `bound` registers them through pdctl (pairing protocol per
    pair), else they are listed on smg's command line."""
    pairs = []
    for n in range(n_pairs):
        prefill = SimProc.create(
            "prefill", log_dir, {"PDSIM_STARTUP_DELAY_S": str(args.prefill_startup)}
        )
        decode_env = {"PDSIM_STARTUP_DELAY_S": str(args.decode_startup), **partner_env(prefill)}
        pairs.append(LocalPair(f"pd{n}", prefill, SimProc.create("decode", log_dir, decode_env)))
    with serving(pairs, log_dir, *GATEWAY_ARGS, bound=bound) as (_, _, gw):
        yield pairs, gw


def coordinated(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    with stack(1, args, log_dir) as (pairs, gw):
        ops, _ = local_ops(pairs, gw, Timeouts(health=120, canary=60, poll=0.1))
        ops.say = lambda _line: None
        (pair,) = ops.source.pairs()
        rep = restart_pair(ops, pair)
        if not rep.ok:
            raise SystemExit(f"restart --both failed: {rep.error}")
        p = rep.phases
        # The first stop to the first request through the pair ("canary" ends there).
        return {"phases_s": p, "downtime_s": p["stop"] + p["start"] + p["health"] + p["canary"]}


def naive(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Stop both, start prefill, wait, start decode, wait, restart the gateway."""
    with stack(1, args, log_dir) as (pairs, gw):
        ops, units = local_ops(pairs, gw)
        (pair,) = ops.source.pairs()
        t0 = time.monotonic()
        units.stop(pair.spec.target)
        units.start(pair.prefills[0].unit)
        pairs[0].prefill.wait_healthy(120)
        units.start(pair.decodes[0].unit)
        pairs[0].decode.wait_healthy(120)
        gw.stop()
        binary = smg_binary()
        assert binary is not None
        new_gw = start_gateway(
            binary, [pairs[0].prefill], [pairs[0].decode], log_dir, *GATEWAY_ARGS
        )
        try:
            new_gw.wait_ready(120)
            return {"downtime_s": first_success(pair) - t0}
        finally:
            new_gw.stop()


def counted_stops(units: LocalUnits) -> dict[str, float]:
    """Make `units.stop` add up each stopped decode's cross-group counter (it dies with the
    process); the returned dict fills in as the roll goes."""
    counted = {"stopped": 0.0}
    stop = units.stop

    def stop_counting(*names: str) -> None:
        stopping = [units.procs[u] for n in names for u in units.targets.get(n, [n])]
        counts = cross_group_transfers(s for s in stopping if s.mode == "decode")
        counted["stopped"] += sum(counts.values())
        stop(*names)

    units.stop = stop_counting  # type: ignore[method-assign]
    return counted


def rolling_under_load(args: argparse.Namespace, log_dir: Path, bound: bool) -> dict[str, Any]:
    with stack(2, args, log_dir, bound) as (pairs, gw):
        ops, units = local_ops(pairs, gw, Timeouts(health=120, canary=60, poll=0.1))
        ops.say = lambda _line: None
        counted = counted_stops(units)
        with constant_load(gw.url, clients=args.clients, max_tokens=16) as outcomes:
            t0 = time.monotonic()
            reports = [r for _ in range(args.rolls) for r in restart_pairs(ops, ops.source.pairs())]
            elapsed = time.monotonic() - t0
        crossed = counted["stopped"] + sum(cross_group_transfers(p.decode for p in pairs).values())
        failures = [o.failure or "" for o in outcomes if not o.ok]
        return {
            "pairs_ok": [r.ok for r in reports],
            "seconds": round(elapsed, 1),
            "requests": len(outcomes),
            "failed": len(failures),
            "failed_in_stream": sum(not f.startswith(("HTTP", "no answer")) for f in failures),
            "first_failures": failures[:3],
            "cross_group_transfers": int(crossed),
            "phases_s": [r.phases for r in reports],
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill-startup", type=float, default=8.0)
    ap.add_argument("--decode-startup", type=float, default=12.0)
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients under load")
    ap.add_argument("--rolls", type=int, default=1, help="rolls of both pairs under load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bound = max(args.prefill_startup, args.decode_startup)
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as d:
        log_dir = Path(d)
        both = coordinated(args, log_dir)
        seq = naive(args, log_dir)
        load = rolling_under_load(args, log_dir, bound=True)
        unbound = rolling_under_load(args, log_dir, bound=False)
    out = {
        "lower_bound_s": bound,
        "restart_both": both,
        "naive_sequential": seq,
        "restart_all_under_load": load,
        "restart_all_under_load_unbound": unbound,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"startup delays: prefill {args.prefill_startup:.0f}s, decode "
        f"{args.decode_startup:.0f}s; lower bound max(startup) = {bound:.1f}s"
    )
    print(
        "restart --both phases (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in both["phases_s"].items())
    )
    for name, r in (("restart --both", both), ("naive sequential", seq)):
        print(
            f"{name:18} downtime {r['downtime_s']:6.2f}s  "
            f"downtime / lower bound {r['downtime_s'] / bound:.2f}"
        )
    for name, r in (("bound (pdctl)", load), ("unbound (smg CLI)", unbound)):
        print(
            f"restart --all x{args.rolls}, 2 pairs, {args.clients} clients, {name}: "
            f"{r['seconds']}s, {r['requests']} requests, {r['failed']} failed "
            f"({r['failed_in_stream']} with HTTP 200), {r['cross_group_transfers']} cross-group "
            f"transfers, pairs ok {r['pairs_ok']}"
        )
        if r["first_failures"]:
            print(f"  first failures: {r['first_failures']}")


if __name__ == "__main__":
    main()
