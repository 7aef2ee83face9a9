"""How fast `pdctl analyze journal` reads a large decode journal, next to `grep -c`.

Generates a synthetic journal (default 1 GB, sglang 0.5.23 line format) in a temporary
directory, runs both on the same file, prints MB/s, the ratio and the analyzer's peak RSS
(which stays flat: the file is streamed in chunks), then removes the file.

    .venv/bin/python benchmarks/analyze_throughput.py [--size-mb 1024] [--dir /tmp] \
        [--accept-len 2.5]

--accept-len makes a speculative-decoding journal (`accept len` on every decode line), which
the analyzer reads with its slower speculative pattern.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdctl.analyze.synth import SynthJournal, write_journal

MB = 1_000_000


def timed(cmd: list[str]) -> tuple[float, float, str, float]:
    """(wall s, CPU s, stdout, peak RSS MB) of one child, measured for that child alone.

    CPU seconds are reported too: on a shared machine the wall clock also measures the
    neighbours."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # grep -c exits 1 on no match
        sys.exit(f"{cmd[0]} failed: {err.decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime, out.decode(), usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--accept-len", type=float, default=None)
    args = ap.parse_args()
    pdctl = str(Path(sys.executable).with_name("pdctl"))
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="pdctl-analyze-bench-") as tmp:
        path = Path(tmp) / "decode.log"
        cfg = SynthJournal(max_running=110, prefill_every=0, seed=1, accept_len=args.accept_len)
        t0 = time.perf_counter()
        size = write_journal(path, cfg, args.size_mb * MB)
        print(f"generated {size / MB:,.0f} MB in {time.perf_counter() - t0:.1f} s: {path}")

        # warm the page cache so neither side pays for the disk
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        grep_s, grep_cpu, grep_out, _ = timed(["grep", "-c", "Decode batch", str(path)])
        ours_s, ours_cpu, ours_out, rss_mb = timed(
            [pdctl, "analyze", "journal", "--file", str(path), "--format", "json"]
        )

        decode_lines = json.loads(ours_out)["input"]["decode_lines"]
        assert decode_lines == int(grep_out), (decode_lines, grep_out)
        mb = size / MB
        print(f"{'':26} {'wall s':>7} {'MB/s':>8}  {'CPU s':>7} {'MB/CPU-s':>8}")
        for name, wall, cpu in (
            ("grep -c 'Decode batch'", grep_s, grep_cpu),
            ("pdctl analyze journal", ours_s, ours_cpu),
        ):
            print(f"{name:26} {wall:7.2f} {mb / wall:8.1f}  {cpu:7.2f} {mb / cpu:8.1f}")
        print(
            f"ratio pdctl/grep           {grep_s / ours_s:7.3f} wall, "
            f"{grep_cpu / ours_cpu:.3f} CPU  ({decode_lines:,} decode lines)"
        )
        print(f"pdctl peak RSS             {rss_mb:7.0f} MB")


if __name__ == "__main__":
    main()
