"""Same-host KV transfer latency and speed through NIXL, as the sim's nixl backend moves KV.

A "decode" process registers its pool (pdctl.sim.nixl_conn.NixlKV) and hands its KV args to
this "prefill" process over a pipe; the prefill then WRITEs each size --repeat times with a
room notification and waits for the transfer to complete, as the sim does per request. UCX
reads its variables from the environment, so compare transports with e.g. `UCX_TLS=tcp`
against the default (shared memory on one host). Prints a table, or JSON with --json.

    .venv/bin/python benchmarks/nixl_transfer.py --sizes-mib 0.25 1 4 16 --repeat 20
    UCX_TLS=tcp .venv/bin/python benchmarks/nixl_transfer.py --json

Cross-host figures need two hosts (issue 14 item 4); this script measures one host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection

from pdctl.sim.nixl_conn import NOTIF_POLL_S, NixlKV, PeerInfo

LOG = logging.getLogger("nixl_transfer")


def decode_side(conn: Connection, pool_bytes: int) -> None:
    """Register a pool, send its KV args, then drain notifications until told to stop."""
    kv = NixlKV(pool_bytes, os.environ, LOG)
    conn.send(kv.info().to_json())
    # With no NIXL progress thread (nixl_conn.py), the target drives UCX by polling its
    # notifications, as the sim's decode does while rooms wait.
    while not conn.poll(NOTIF_POLL_S):
        kv.agent.get_new_notifs()


async def measure(sizes: list[int], repeat: int, peer: PeerInfo, slot: int) -> list[dict]:
    kv = NixlKV(slot, os.environ, LOG)
    kv.add_peer(peer)
    rows = []
    room = 0
    for size in sizes:
        await kv.write(peer.agent_name, size, 0, room)  # warm-up: endpoint and first touch
        secs = []
        for _ in range(repeat):
            room += 1
            secs.append(await kv.write(peer.agent_name, size, 0, room))
        med = statistics.median(secs)
        rows.append(
            {
                "size_mib": size / 2**20,
                "latency_ms_median": med * 1000,
                "latency_ms_min": min(secs) * 1000,
                "speed_gib_s_median": size / 2**30 / med,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[0.25, 1.0, 4.0, 16.0])
    ap.add_argument("--repeat", type=int, default=10, help="timed WRITEs per size")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args()
    if a.repeat < 1 or any(s <= 0 for s in a.sizes_mib):
        ap.error("--repeat and every --sizes-mib must be positive")
    sizes = [int(s * 2**20) for s in a.sizes_mib]
    # NixlKV's pool holds POOL_SLOTS slots; one slot as large as the largest WRITE is enough.
    here, there = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=decode_side, args=(there, max(sizes)))
    proc.start()
    try:
        if not here.poll(60):
            raise SystemExit("Error: the decode process did not register within 60 s")
        peer = PeerInfo.from_json(here.recv())
        t0 = time.perf_counter()
        rows = asyncio.run(measure(sizes, a.repeat, peer, max(sizes)))
        elapsed = time.perf_counter() - t0
        here.send("done")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    env = {k: os.environ[k] for k in ("UCX_TLS", "UCX_NET_DEVICES") if k in os.environ}
    if a.json:
        print(json.dumps({"ucx_env": env, "elapsed_s": elapsed, "rows": rows}, indent=2))
        return
    print(f"same-host NIXL WRITE (UCX env: {env or 'defaults'}), {a.repeat} per size")
    print(f"{'MiB':>8} {'median ms':>10} {'min ms':>8} {'GiB/s':>7}")
    for r in rows:
        print(
            f"{r['size_mib']:>8.2f} {r['latency_ms_median']:>10.3f} "
            f"{r['latency_ms_min']:>8.3f} {r['speed_gib_s_median']:>7.2f}"
        )


if __name__ == "__main__":
    main()
