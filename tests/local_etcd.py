"""A real one-member etcd on 127.0.0.1 (Debian's etcd-server), with the certificates
`pdctl etcd pki` makes and the TLS flags roles/pdstack_etcd gives a member: for tests that need
the store (its health check, Prometheus scraping it). Stopped by PID."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from pdctl.coord import pki
from pdctl.testing.stack import free_port, stop_pid
from pdctl.topology import TopologyCoord
from tests.conftest import require_path

START_TIMEOUT_S = 30


@dataclass(frozen=True)
class LocalEtcd:
    coord: TopologyCoord  # as a controller sees it: the PKI directory's controller certificate
    pki: Path
    metrics_port: int

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"


@contextmanager
def running_etcd(root: Path) -> Iterator[LocalEtcd]:
    etcd = require_path("/usr/bin/etcd", "etcd (Debian's etcd-server)")
    pki_dir = root / "pki"
    pki.ensure(pki_dir, [pki.Member("local", "127.0.0.1")], ["local"])
    cert, key = pki.member_paths(pki_dir, "local")
    ca = pki.ca_paths(pki_dir)[0]
    client, peer, metrics = free_port(), free_port(), free_port()
    argv = [
        str(etcd), "--name", "local", "--data-dir", str(root / "etcd-data"),
        "--listen-client-urls", f"https://127.0.0.1:{client}",
        "--advertise-client-urls", f"https://127.0.0.1:{client}",
        "--listen-peer-urls", f"https://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"https://127.0.0.1:{peer}",
        "--initial-cluster", f"local=https://127.0.0.1:{peer}",
        "--initial-cluster-token", pki.cluster_token(pki_dir),
        "--listen-metrics-urls", f"http://127.0.0.1:{metrics}",
        "--client-cert-auth", "--cert-file", str(cert), "--key-file", str(key),
        "--trusted-ca-file", str(ca),
        "--peer-client-cert-auth", "--peer-cert-file", str(cert), "--peer-key-file", str(key),
        "--peer-trusted-ca-file", str(ca),
    ]  # fmt: skip
    log_path = root / "etcd.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                r = requests.get(f"http://127.0.0.1:{metrics}/health", timeout=1)
                if r.json().get("health") == "true":
                    break
            except (requests.RequestException, ValueError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"etcd not healthy: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        coord = TopologyCoord(
            endpoints=[f"https://127.0.0.1:{client}"], **pki.controller_tls(pki_dir)
        )
        yield LocalEtcd(coord, pki_dir, metrics)
    finally:
        stop_pid(proc)
