"""Which lane of `make test` ended last, and what each ran: reads the lane log the suite's
workers write (.lanes.jsonl, tests/lanes.py) and prints, per lane (xdist worker), its units
of work (modules) in the order it ran them, with their start and end in seconds from the
suite's first test, their length and the CPU seconds the lane spent on each (pytest and the
processes it waited for: Ansible, ssh, local engines; the test hosts' own CPU is not in it).
The suite is done when its last lane is: this says which chain of modules that was and where
the other lanes had run dry.

    make test   # or any pytest run in lanes (-n N)
    .venv/bin/python benchmarks/suite_lanes.py [.lanes.jsonl] [--format json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def lanes(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per worker, its modules in order: {module, start, end, cpu} (seconds from the first
    test; the CPU seconds its lane spent on it, children reaped included, test hosts not),
    the phases of one module merged (a module runs in one lane, start to end)."""
    t0 = min(r["start"] for r in lines)
    spans: dict[tuple[str, str], list[float]] = {}
    for r in lines:
        key = (r["worker"], r["nodeid"].split("::", 1)[0])
        span = spans.setdefault(key, [r["start"], r["stop"], 0.0])
        span[0], span[1] = min(span[0], r["start"]), max(span[1], r["stop"])
        span[2] += r.get("cpu", 0.0)  # a log from before the lanes logged CPU: 0
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (worker, module), (start, end, cpu) in spans.items():
        unit = {"module": module, "start": start - t0, "end": end - t0, "cpu": round(cpu, 1)}
        by_worker[worker].append(unit)
    for units in by_worker.values():
        units.sort(key=lambda u: u["start"])
    return dict(sorted(by_worker.items(), key=lambda kv: int(kv[0].removeprefix("gw"))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("log", nargs="?", type=Path, default=ROOT / ".lanes.jsonl")
    ap.add_argument("--format", choices=["text", "json"], default="text")
    ap.add_argument("--min", type=float, default=10, help="hide modules shorter than this (s)")
    a = ap.parse_args()
    if not a.log.is_file():
        sys.exit(f"no lane log at {a.log}: run the suite in lanes first (make test)")
    lines = [json.loads(x) for x in a.log.read_text().splitlines() if x.strip()]
    if not lines:
        sys.exit(f"{a.log} is empty")
    result = lanes(lines)
    if a.format == "json":
        print(json.dumps(result, indent=2))
        return
    for worker, units in result.items():
        end = max(u["end"] for u in units)
        print(f"{worker}: {len(units)} modules, ends at {end:.0f} s")
        for u in units:
            if u["end"] - u["start"] >= a.min:
                length = u["end"] - u["start"]
                cpu = f"{u['cpu']:>6.0f}"
                print(f"  {u['start']:>6.0f} {u['end']:>6.0f} {length:>6.0f} {cpu}  {u['module']}")


if __name__ == "__main__":
    main()
