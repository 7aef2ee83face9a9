"""KV transfer latency and speed through NIXL, as the sim's nixl backend moves KV.

A "decode" process registers its pool (pdctl.sim.nixl_conn.NixlKV) and hands its KV args to
a "prefill" process; the prefill then WRITEs each size --repeat times with a room
notification and waits for the transfer to complete, as the sim does per request. UCX reads
its variables from the environment, so compare transports with e.g. `UCX_TLS=tcp` against
the default (shared memory on one host). Prints a table, or JSON with --json.

Same host (both processes here, the KV args over a pipe):

    .venv/bin/python benchmarks/nixl_transfer.py --sizes-mib 0.25 1 4 16 --repeat 20
    UCX_TLS=tcp .venv/bin/python benchmarks/nixl_transfer.py --json

Across hosts (the fleet rehearsal, docs/testhost.md): each side runs on its host through a
command prefix (ssh), with the hosts' pdctl venv; the KV args travel through this process.

    .venv/bin/python benchmarks/nixl_transfer.py --python /opt/pdstack/venv/bin/python \
        --prefill-via "ssh -F deploy/testhost/state/pdfleet/ssh_config pdfleet1" \
        --decode-via "ssh -F deploy/testhost/state/pdfleet/ssh_config pdfleet2"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import select
import shlex
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from pdctl.sim.nixl_conn import NOTIF_POLL_S, NixlKV, PeerInfo

LOG = logging.getLogger("nixl_transfer")
KV_ARGS = "KV_ARGS"  # marks the decode side's line on stdout (NIXL logs there too)


def decode_side(conn: Connection, pool_bytes: int) -> None:
    """Register a pool, send its KV args, then drain notifications until told to stop."""
    kv = NixlKV(pool_bytes, os.environ, LOG)
    conn.send(kv.info().to_json())
    # With no NIXL progress thread (nixl_conn.py), the target drives UCX by polling its
    # notifications, as the sim's decode does while rooms wait.
    while not conn.poll(NOTIF_POLL_S):
        kv.agent.get_new_notifs()


def serve_decode(pool_bytes: int) -> None:
    """The decode side over stdio (--serve-decode): its KV args on stdout, then serve until
    stdin closes."""
    kv = NixlKV(pool_bytes, os.environ, LOG)
    print(KV_ARGS, json.dumps(kv.info().to_json()), flush=True)
    while not select.select([sys.stdin], [], [], NOTIF_POLL_S)[0]:
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


def same_host(sizes: list[int], repeat: int) -> tuple[list[dict], float]:
    # NixlKV's pool holds POOL_SLOTS slots; one slot as large as the largest WRITE is enough.
    here, there = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=decode_side, args=(there, max(sizes)))
    proc.start()
    try:
        if not here.poll(60):
            raise SystemExit("Error: the decode process did not register within 60 s")
        peer = PeerInfo.from_json(here.recv())
        t0 = time.perf_counter()
        rows = asyncio.run(measure(sizes, repeat, peer, max(sizes)))
        elapsed = time.perf_counter() - t0
        here.send("done")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return rows, elapsed


UCX_VARS = ("UCX_TLS", "UCX_NET_DEVICES")


def _remote(via: str, python: str, *args: str) -> list[str]:
    """Run this script on another host: its source as `python -c`, through `via`, with this
    side's UCX variables (ssh passes no environment)."""
    env = [f"{k}={os.environ[k]}" for k in UCX_VARS if k in os.environ]
    code = Path(__file__).read_text()
    return [*shlex.split(via), shlex.join(["env", *env, python, "-c", code, *args])]


def cross_host(a: argparse.Namespace, sizes: list[int]) -> tuple[list[dict], float]:
    mib = [str(s / 2**20) for s in sizes]
    decode = subprocess.Popen(
        _remote(a.decode_via, a.python, "--serve-decode", "--sizes-mib", *mib),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert decode.stdout is not None and decode.stdin is not None
        if not select.select([decode.stdout], [], [], 60)[0]:
            raise SystemExit("Error: the decode side did not register within 60 s")
        peer = ""
        while not peer.startswith(KV_ARGS):
            peer = decode.stdout.readline()
            if not peer:
                raise SystemExit(f"Error: the decode side exited (status {decode.wait(10)})")
        peer = peer.removeprefix(KV_ARGS)
        prefill = subprocess.run(
            _remote(
                a.prefill_via,
                a.python,
                "--peer-stdin",
                "--json",
                "--repeat",
                str(a.repeat),
                "--sizes-mib",
                *mib,
            ),
            input=peer,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if prefill.returncode:
            raise SystemExit(f"Error: the prefill side failed: {prefill.stderr.strip()[-2000:]}")
        out = json.loads(prefill.stdout.splitlines()[-1])
        return out["rows"], out["elapsed_s"]
    finally:
        if decode.stdin is not None:
            decode.stdin.close()  # the decode side serves until its stdin closes
        try:
            decode.wait(10)
        except subprocess.TimeoutExpired:
            decode.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[0.25, 1.0, 4.0, 16.0])
    ap.add_argument("--repeat", type=int, default=10, help="timed WRITEs per size")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--prefill-via", help="command prefix that runs the prefill side elsewhere")
    ap.add_argument("--decode-via", help="command prefix that runs the decode side elsewhere")
    ap.add_argument("--python", default="python3", help="the Python (with pdctl) over there")
    ap.add_argument("--serve-decode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer-stdin", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.repeat < 1 or any(s <= 0 for s in a.sizes_mib):
        ap.error("--repeat and every --sizes-mib must be positive")
    if bool(a.prefill_via) != bool(a.decode_via):
        ap.error("--prefill-via and --decode-via go together")
    sizes = [int(s * 2**20) for s in a.sizes_mib]
    if a.serve_decode:
        serve_decode(max(sizes))
        return
    if a.peer_stdin:
        peer = PeerInfo.from_json(json.loads(sys.stdin.readline()))
        t0 = time.perf_counter()
        rows = asyncio.run(measure(sizes, a.repeat, peer, max(sizes)))
        a.json, elapsed = True, time.perf_counter() - t0
    elif a.prefill_via:
        rows, elapsed = cross_host(a, sizes)
    else:
        rows, elapsed = same_host(sizes, a.repeat)
    where = "cross-host" if a.prefill_via != a.decode_via else "same-host"
    env = {k: os.environ[k] for k in UCX_VARS if k in os.environ}
    if a.json:
        print(json.dumps({"where": where, "ucx_env": env, "elapsed_s": elapsed, "rows": rows}))
        return
    print(f"{where} NIXL WRITE (UCX env: {env or 'defaults'}), {a.repeat} per size")
    print(f"{'MiB':>8} {'median ms':>10} {'min ms':>8} {'GiB/s':>7}")
    for r in rows:
        print(
            f"{r['size_mib']:>8.2f} {r['latency_ms_median']:>10.3f} "
            f"{r['latency_ms_min']:>8.3f} {r['speed_gib_s_median']:>7.2f}"
        )


if __name__ == "__main__":
    main()
