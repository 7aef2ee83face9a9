"""Where a command's CPU goes, by component: run it (e.g. `make test`) under the kernel's
process accounting and print the CPU seconds of every process that ended, grouped by what it
was (sim engines, the gateway, Ansible on the controller and on the hosts, pip, pytest...).

The test suite is CPU-bound on 2 cores (issue 20): its wall time follows the sum of these
figures, so this table says what to make cheaper. Process accounting (Debian's `acct`:
`accton`, `dump-acct`) records every process as it exits, the test hosts' too (an nspawn
host's processes are accounted in the controller's namespace as well); a process is named
by its command line, read from /proc every 2 s while it ran, or by its nearest named ancestor
(a short `ssh` that pytest started counts as pytest's), or else by its 16-character name.
Accounting is machine-wide: every process that ends while the command runs is counted, so run
it alone. Run as root; it turns accounting off at the end.

    apt-get install acct
    .venv/bin/python benchmarks/suite_cpu.py -- make test
    .venv/bin/python benchmarks/suite_cpu.py --format json -- .venv/bin/pytest tests/unit -q
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 2.0  # how often command lines are read from /proc
HZ = 100  # dump-acct prints times in the kernel's AHZ ticks

# First match wins: a command line (or, failing that, the accounting's 16-character comm).
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("sim engines", r"-m pdctl\.sim\b"),
    ("gateway (smg)", r"(^|/)smg\b|smg::router"),
    ("etcd", r"(^|/)etcd( |$)"),
    ("prometheus", r"(^|/)prometheus( |$)"),
    ("exporters", r"exporter"),
    ("ansible: controller", r"ansible-playbook|(^|/)ansible( |$)|^worker:|mitogen mux"),
    ("ansible: on the hosts (Mitogen)", r"^mitogen:|mitogen:"),
    ("ansible-lint", r"ansible-lint"),
    ("pip", r"(^|/)pip3?( |$)|-m pip\b"),
    ("pdctl", r"(^|/)pdctl( |$)"),
    ("lint (ruff, mypy, shellcheck)", r"(^|/)(ruff|mypy|shellcheck)( |$)"),
    ("pytest and its helpers", r"pytest-xdist|-m pytest\b|(^|/)pytest( |$)"),
    ("ssh (client)", r"^ssh( |$)"),
    ("sshd", r"^sshd"),
    ("systemd, journald", r"systemd"),
)
RULES = [(name, re.compile(rx)) for name, rx in COMPONENTS]


@dataclass(frozen=True)
class Exited:
    comm: str
    cpu: float  # user + system seconds
    pid: int
    ppid: int


def component(text: str) -> str | None:
    return next((name for name, rx in RULES if rx.search(text)), None)


def sample_cmdlines(seen: dict[int, str], stop: threading.Event) -> None:
    """pid -> command line of every process alive at some sample (the first one seen)."""
    while True:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) not in seen:
                try:
                    raw = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                if raw:
                    seen[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
        if stop.wait(SAMPLE_S):
            return


def read_pacct(path: Path) -> list[Exited]:
    out = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True, check=True)
    records = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 11:
            continue
        records.append(Exited(f[0], (float(f[2]) + float(f[3])) / HZ, int(f[9]), int(f[10])))
    return records


def classify(records: list[Exited], cmdlines: dict[int, str]) -> list[tuple[str, float]]:
    """CPU seconds per component, most first."""
    parent = {r.pid: r.ppid for r in records}

    def named(pid: int) -> str | None:
        for _ in range(16):  # up the ancestry to the first process with a known command line
            if pid in cmdlines and (name := component(cmdlines[pid])):
                return name
            if pid not in parent or parent[pid] == pid:
                return None
            pid = parent[pid]
        return None

    cpu: defaultdict[str, float] = defaultdict(float)
    for r in records:
        cpu[named(r.pid) or component(r.comm) or f"other: {r.comm}"] += r.cpu
    return sorted(cpu.items(), key=lambda kv: -kv[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--top", type=int, default=20, help="rows of the table (default 20)")
    ap.add_argument("command", nargs="+", help="the command to measure, after --")
    args = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("process accounting needs root")
    for tool in ("accton", "dump-acct"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            ap.error(f"{tool} not found: apt-get install acct")

    cmdlines: dict[int, str] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_cmdlines, args=(cmdlines, stop), daemon=True)
    with tempfile.TemporaryDirectory() as tmp:
        pacct = Path(tmp) / "pacct"
        pacct.touch()
        subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
        sampler.start()
        start = time.monotonic()
        try:
            code = subprocess.run(args.command, check=False).returncode
        finally:
            wall = time.monotonic() - start
            subprocess.run(["accton", "off"], check=False, capture_output=True)
            stop.set()
            sampler.join()
        cpu = classify(read_pacct(pacct), cmdlines)

    total = sum(seconds for _, seconds in cpu)
    available = wall * (os.cpu_count() or 1)
    if args.format == "json":
        shares = {k: round(v, 1) for k, v in cpu}
        summary = {"exit_code": code, "wall_s": round(wall, 1), "cpu_s": round(total, 1)}
        print(json.dumps({**summary, "components": shares}))
    else:
        busy = 100 * total / available
        print(f"\n{args.command!r}: exit {code}, wall {wall:.0f} s")
        print(f"CPU of the processes that ended meanwhile (the machine's): {total:.0f} s of ")
        print(f"{available:.0f} s on {os.cpu_count()} cores ({busy:.0f}%)")
        print(f"{'component':<34} {'CPU s':>8} {'share':>6}")
        for name, seconds in cpu[: args.top]:
            print(f"{name:<34} {seconds:8.1f} {100 * seconds / total:5.1f}%")
    return code


if __name__ == "__main__":
    sys.exit(main())
