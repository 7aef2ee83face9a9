"""Staging throughput: a made-up model of --mib MiB (real safetensors files,
pdctl.testing.dummy_model) copied with the rsync command site.yml runs
(pdctl.model.staging.rsync_argv, a shared source: local disk to local disk) and verified with
`pdctl model verify`'s sha256 (pdctl.model.manifest), --runs times each into a fresh
directory; then the fleet's copy time for --model-gb on --hosts, --concurrency hosts at once,
worked out on paper from the measured rates and --source-gbps (the source's link, shared by
the hosts copying at once; the copy here has no network in it).

    .venv/bin/python benchmarks/model_staging.py [--mib 300] [--runs 3] [--concurrency 4]
        [--model-gb 160] [--hosts 16 100] [--source-gbps 25] [--host-gbps 25]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pdctl.model import manifest, staging
from pdctl.testing import dummy_model


def _timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _verified(dest: Path) -> None:
    problems = manifest.verify(dest)
    assert not problems, f"{dest} differs from its source: {problems}"


def measure(mib: int, runs: int) -> tuple[float, float, float]:
    """Median (copy MB/s, verify MB/s, manifest MB/s) over runs, each copy into a fresh
    directory with the page cache as the run left it (the source stays cached: as a
    controller's or staging host's would after the first host)."""
    with tempfile.TemporaryDirectory(prefix="pdstack-stage-bench-") as tmp:
        source = Path(tmp) / "source"
        dummy_model.make(source, mib=mib, shards=4)
        made = _timed(partial(manifest.write, source))
        size_mb = manifest.read(source).total_bytes / 1e6
        copies, verifies = [], []
        for n in range(runs):
            dest = Path(tmp) / f"dest-{n}"
            argv = staging.rsync_argv("shared", str(source), f"{dest}/")
            copies.append(_timed(partial(subprocess.run, argv, check=True, capture_output=True)))
            verifies.append(_timed(partial(_verified, dest)))
            shutil.rmtree(dest)
    return (
        size_mb / statistics.median(copies),
        size_mb / statistics.median(verifies),
        size_mb / made,
    )


def fleet_minutes(
    gb: float, hosts: int, concurrency: int, host_mbs: float, verify_mbs: float, source_gbps: float
) -> tuple[float, float]:
    """(per-host copy rate MB/s, fleet minutes): hosts copy in ceil(hosts / concurrency)
    rounds (stage.yml's throttle), each host at the least of its own rate and its share of the
    source's link; then every host verifies its copy at once (the next task, sha256 over the
    whole revision)."""
    share = source_gbps * 1000 / 8 / min(concurrency, hosts)
    rate = min(host_mbs, share)
    copy_s = math.ceil(hosts / concurrency) * gb * 1000 / rate
    return rate, (copy_s + gb * 1000 / verify_mbs) / 60


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4, help="model.staging.concurrency")
    p.add_argument("--model-gb", type=float, default=160)
    p.add_argument("--hosts", type=int, nargs="+", default=[16, 100])
    p.add_argument("--source-gbps", type=float, default=25, help="The source's link (Gb/s).")
    p.add_argument("--host-gbps", type=float, default=25, help="A GPU host's link (Gb/s).")
    a = p.parse_args()
    copy_mbs, verify_mbs, manifest_mbs = measure(a.mib, a.runs)
    print(
        f"measured on {a.mib} MiB, median of {a.runs}: rsync copy {copy_mbs:.0f} MB/s, "
        f"verify (sha256) {verify_mbs:.0f} MB/s, manifest {manifest_mbs:.0f} MB/s"
    )
    link_mbs = a.host_gbps * 1000 / 8
    # The copy here is disk to disk on this machine; a GPU host's NVMe keeps up with its link,
    # so the second line is the network-bound fleet.
    for what, host_mbs in (("rates measured here", min(copy_mbs, link_mbs)),
                           ("hosts at their link", link_mbs)):  # fmt: skip
        for hosts in a.hosts:
            rate, minutes = fleet_minutes(
                a.model_gb, hosts, a.concurrency, host_mbs, verify_mbs, a.source_gbps
            )
            print(
                f"{what}: {a.model_gb:g} GB to {hosts} hosts, {a.concurrency} at once, source "
                f"{a.source_gbps:g} Gb/s: {rate:.0f} MB/s per host, fleet {minutes:.0f} min"
            )


if __name__ == "__main__":
    main()
