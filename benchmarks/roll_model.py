"""Roll time of `pdctl restart --both --all --max-unavailable K`: the model, its table for
16 and 100 hosts, and local runs measured against it.

The model is the roll's own scheduler played forward (pdctl.ops.roll.finish, which the
progress line's time to go uses too): every group takes T = drain + stop + start-up + canary
+ register seconds and starts on the first of K lanes to come free, so N groups roll in
ceil(N/K) x T. K is what --max-unavailable makes of a count or a percentage of the fleet's
groups (roll.budget), less what groups out for another reason take from the floor
(roll.lanes). site.yml's roll is this same roll, over the play's changed groups.

    .venv/bin/python benchmarks/roll_model.py            # the table in docs/restart.md
    .venv/bin/python benchmarks/roll_model.py --measure 4 --k 1 2 [--clients 4]

--measure rolls N local sim pairs behind the real gateway (benchmarks/restart_both.py's
stack) under streaming load, once per K, and sets each roll's wall time beside the model fed
with the groups' own measured phase times (pdctl.ops.report.Report.phases, what the fleet's
restart history records). Run it under the integration lock: it takes loopback ports.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from pdctl.ops import roll

# Seconds per group besides the engines' start-up, for a real model (docs/restart.md,
# "Roll time: the model", says where each comes from).
PHASES_S = {"drain": 20.0, "stop": 10.0, "canary": 5.0, "register": 5.0}
# Start-up (weights loaded, CUDA graphs captured, /health 200) that SGLang users report for
# large models: 3 to 6.5 minutes (sgl-project/sglang#27139, #27052).
STARTUPS_MIN = (3.0, 6.5)
# Hosts and groups per host: the reference host's one pair (TP4 + TP4 on 8 GPUs), or two
# (TP2 engines, as the rehearsal hosts lay out).
FLEETS = ((16, 1), (16, 2), (100, 1), (100, 2))
KS = ("1", "2", "10%", "25%")


def roll_seconds(groups: int, k: str, per_group_s: float) -> float:
    """`pdctl restart --both --all --max-unavailable K` over `groups` groups of T seconds."""
    b = roll.budget(k, None, groups)
    return roll.finish([], [per_group_s] * groups, roll.lanes(b, groups))


def _hm(s: float) -> str:
    h, m = divmod(math.ceil(s / 60), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def table() -> list[str]:
    """The docs table: one row per fleet and start-up time, a column per K."""

    def k_of(k: str, groups: int) -> str:
        return k if not k.endswith("%") else f"{k} = {roll.max_unavailable(k, groups)}"

    lines = [
        "| hosts x groups (N) | start-up | T per group | "
        + " | ".join(f"K = {k}" for k in KS)
        + " |",
        "|---|---|---|" + "---|" * len(KS),
    ]
    for hosts, per_host in FLEETS:
        groups = hosts * per_host
        for startup in STARTUPS_MIN:
            t = startup * 60 + sum(PHASES_S.values())
            cells = [
                f"{_hm(roll_seconds(groups, k, t))}"
                + ("" if not k.endswith("%") else f" ({k_of(k, groups)})")
                for k in KS
            ]
            lines.append(
                f"| {hosts} x {per_host} ({groups}) | {startup:g} min | {t:.0f} s | "
                + " | ".join(cells)
                + " |"
            )
    return lines


def measure(n: int, ks: list[str], clients: int, startups: tuple[float, float]) -> None:
    # restart_both.py sits beside this script (sys.path[0] when run as above).
    from restart_both import stack

    from pdctl.ops.context import Timeouts
    from pdctl.ops.restart import restart_pairs
    from pdctl.testing.localproc import local_ops
    from pdctl.testing.stack import constant_load

    args = argparse.Namespace(prefill_startup=startups[0], decode_startup=startups[1])
    with tempfile.TemporaryDirectory() as d, stack(n, args, Path(d)) as (pairs, gw):
        ops, _ = local_ops(pairs, gw, Timeouts(health=300, canary=120, poll=0.1))
        ops.say = lambda _line: None
        print(f"{n} sim pairs, start-up {startups[0]:g} s prefill / {startups[1]:g} s decode")
        for k in ks:
            b = roll.budget(k, None, n)
            chosen = roll.prepare(ops, ops.source.pairs(), b.min_serving or 0, False)
            with constant_load(gw.url, clients=clients, max_tokens=16, timeout=30) as outcomes:
                t0 = time.monotonic()
                reports = restart_pairs(ops, chosen, budget=b)
                took = time.monotonic() - t0
            if not all(r.ok for r in reports):
                raise SystemExit(f"K={k}: a group failed: {[r.error for r in reports]}")
            each = {r.target: sum(r.phases.values()) for r in reports}
            model = roll.finish([], [each[p.id] for p in chosen], roll.lanes(b, n))
            phases = {
                ph: sum(r.phases.get(ph, 0.0) for r in reports) / len(reports)
                for ph in reports[0].phases
            }
            failed = sum(not o.ok for o in outcomes)
            groups = ", ".join(f"{v:.1f}" for v in each.values())
            print(
                f"K={k}: roll {took:.1f} s, model from the groups' phase times {model:.1f} s "
                f"(measured / model {took / model:.2f}); groups {groups} s; "
                f"requests {len(outcomes)}, failed {failed}"
            )
            print("  mean phase s: " + ", ".join(f"{ph} {v:.2f}" for ph, v in phases.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", type=int, metavar="N", help="roll N local sim pairs")
    ap.add_argument("--k", nargs="+", default=["1", "2"], help="--max-unavailable values")
    ap.add_argument("--clients", type=int, default=4, help="streaming clients during a roll")
    ap.add_argument("--prefill-startup", type=float, default=8.0)
    ap.add_argument("--decode-startup", type=float, default=12.0)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, args.k, args.clients, (args.prefill_startup, args.decode_startup))
        return
    print("\n".join(table()))


if __name__ == "__main__":
    main()
