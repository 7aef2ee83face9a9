"""The dashboard previews in docs/img: the rehearsal (sim pair, real gateway, pd-exporter, node
exporter, Prometheus: the live monitoring tests' stack) driven through a short story, then
every dashboard rendered over it by monitoring.preview.

The story: steady load (2 clients), a load step (8 clients), back to 2; then the decode
restarted alone (the pair canary fails: the production incident), and the coordinated restart
of both engines that heals it (what `pdctl restart --both` does), with a quiet minute after.

    .venv/bin/python benchmarks/dashboard_previews.py [--out docs/img] [--scale 1]

--scale stretches every phase (2 doubles the story's length). Prints each phase's wall times
and the preview's report; exits 1 when a panel could not be drawn.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the live monitoring tests' stack lives in tests/

from monitoring.preview import Prometheus, boards, render, report  # noqa: E402
from pdctl.testing.stack import constant_load  # noqa: E402
from tests.integration.live_prometheus import monitored_pair  # noqa: E402

SCRAPE_S = 1.0  # the rehearsal's Prometheus scrapes every second
MAX_TOKENS = 48


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="pdstack-previews-") as tmp,
        monitored_pair(Path(tmp), {}) as pair,
    ):
        start = time.time()

        def phase(name: str, seconds: float) -> None:
            print(f"{time.time() - start:6.1f} s  {name}", flush=True)
            time.sleep(seconds * args.scale)

        with constant_load(pair.gateway.url, 2, MAX_TOKENS):
            phase("steady load, 2 clients", 50)
            with constant_load(pair.gateway.url, 6, MAX_TOKENS):
                phase("load step: 6 clients more", 50)
            phase("back to 2 clients", 20)
            pair.restart_decode_alone()
            phase("decode restarted alone: the pair canary fails", 30)
            pair.restart_both()
            phase("both engines restarted together: the canary passes", 40)
        phase("the last scrapes", 5 / args.scale)
        end = time.time()
        prom = Prometheus(pair.prom.url)
        previews = [
            render(b, prom, start, end, SCRAPE_S, args.out / f"{b['uid']}.png") for b in boards()
        ]
    lines, ok = report(previews)
    print("\n".join(lines))
    for out in sorted(args.out.glob("pdstack-*.png")):
        print(f"{out}: {out.stat().st_size / 1000:.0f} kB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
