"""A real one-member etcd (Debian's etcd-server) on free local ports, for tests and
benchmarks that need the coordination store: started as a process of its own, stopped by PID.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from pdctl.testing.stack import free_port
from pdctl.topology import TopologyCoord

ETCD = "etcd"
# Short leases, so a dead holder's lock frees in seconds (the deployed default is 15 s).
LOCK_TTL_S = 3.0


@contextlib.contextmanager
def local_etcd(
    workdir: Path, lock_ttl_s: float = LOCK_TTL_S, gateway_ttl_s: float = LOCK_TTL_S
) -> Iterator[TopologyCoord]:
    """A one-member etcd in `workdir` (its data and log), as a topology's coord section."""
    binary = shutil.which(ETCD)
    if binary is None:
        raise RuntimeError("no etcd on PATH: apt-get install etcd-server (scripts/setup.sh)")
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "etcd.log"
    argv = [
        binary,
        "--name=test",
        f"--data-dir={workdir / 'data'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=test={peer_url}",
        "--log-outputs=stderr",
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=1).json().get("health") == "true":
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not become healthy within 20s (log {log})")
            time.sleep(0.1)
        yield TopologyCoord(
            endpoints=[url],
            ca_file="",
            cert_file="",
            key_file="",
            lock_ttl_s=lock_ttl_s,
            gateway_ttl_s=gateway_ttl_s,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
