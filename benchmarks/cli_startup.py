"""How long `pdctl` takes to start: `validate` on the reference profile, `--help`, and where
the import time of `validate` goes (`python -X importtime`).

Runs each command RUNS times in a fresh interpreter and prints the median and the fastest
wall time, plus CPU seconds (on a shared machine the wall clock also measures the
neighbours). Point PYTHONPATH at another checkout to measure that one.

    .venv/bin/python benchmarks/cli_startup.py [--runs 10] [--top 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATE = [
    "validate",
    "-i",
    str(ROOT / "inventory.ini"),
    "-p",
    str(ROOT / "deploy/profiles/reference.yml"),
]
CASES = {"pdctl validate (reference)": VALIDATE, "pdctl --help": ["--help"]}
ENTRY = "import sys; from pdctl.cli import main; sys.argv[0] = 'pdctl'; main()"


def run(args: list[str], extra: list[str] | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s, stderr) of one `pdctl ARGS` in a fresh interpreter."""
    cmd = [sys.executable, *(extra or []), "-c", ENTRY, *args]
    start = time.perf_counter()
    # Run from / so that PYTHONPATH, not the working directory, decides which pdctl loads.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/"
    )
    err = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"pdctl {' '.join(args)} failed:\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, err


def import_breakdown(top: int) -> tuple[float, list[tuple[float, str]]]:
    """Total import time of `pdctl validate` and its largest top-level imports (cumulative)."""
    _, _, err = run(VALIDATE, ["-X", "importtime"])
    total, tops = 0.0, []
    for line in err.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():
            continue  # the header line
        if not name.startswith("  "):  # top level: imported by the script itself
            seconds = int(cumulative) / 1e6
            total += seconds
            tops.append((seconds, name.strip()))
    return total, sorted(tops, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=12, help="largest imports to list")
    opts = parser.parse_args()
    run(VALIDATE)  # warm the page cache and the bytecode
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'CPU s':>7}  ({opts.runs} runs)")
    for label, args in CASES.items():
        samples = [run(args) for _ in range(opts.runs)]
        walls = [w for w, _, _ in samples]
        cpu = statistics.median(c for _, c, _ in samples)
        print(f"{label:32} {statistics.median(walls):9.3f} {min(walls):7.3f} {cpu:7.3f}")
    total, tops = import_breakdown(opts.top)
    print(f"\nimports of pdctl validate: {total:.3f} s; largest top-level (cumulative):")
    for seconds, name in tops:
        print(f"  {seconds:6.3f}  {name}")


if __name__ == "__main__":
    main()
