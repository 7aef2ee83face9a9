"""The fleet restart lock's own cost: acquire and release latency, median and p99, over N
tries, against a real local etcd of one member and of three (Debian's etcd-server, on
loopback: no network latency, so this is etcd's commit path plus pdctl's client).

An acquire is a lease grant and a create-if-absent transaction; a release a delete-if-ours
transaction and a lease revoke; the fencing check before each restart step is one read.

    .venv/bin/python benchmarks/lock_latency.py [--tries 100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pdctl.coord.lock import Grant, RestartLock
from pdctl.coord.store import Store
from pdctl.testing.etcd import local_etcd


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]
    return f"median {statistics.median(ordered) * 1000:6.1f} ms   p99 {p99 * 1000:6.1f} ms"


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(size: int, tries: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, local_etcd(Path(tmp), size=size) as etcd:
        fleet = RestartLock(Store(etcd.coord), 15)
        acquire, release, check = [], [], []
        for _ in range(tries):
            took, grant = _timed(partial(fleet.acquire, "benchmarks/lock_latency.py"))
            assert isinstance(grant, Grant), grant
            acquire.append(took)
            check.append(_timed(partial(fleet.check, grant))[0])
            release.append(_timed(partial(fleet.release, grant))[0])
        print(f"etcd, {size} member(s), {tries} tries")
        print(f"  acquire         {_ms(acquire)}")
        print(f"  fencing check   {_ms(check)}")
        print(f"  release         {_ms(release)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=100)
    args = ap.parse_args()
    for size in (1, 3):
        measure(size, args.tries)


if __name__ == "__main__":
    main()
