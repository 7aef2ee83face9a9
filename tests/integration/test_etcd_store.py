"""A real one-member etcd (Debian's etcd-server) with the certificates `pdctl etcd pki` makes:
mutual TLS as the role configures it, and `pdctl.coord.health` naming each member's state."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from pdctl.coord import health, pki
from pdctl.testing.stack import free_port, stop_pid
from pdctl.topology import TopologyCoord
from tests.conftest import require_path


@dataclass(frozen=True)
class Store:
    coord: TopologyCoord  # as the controller sees it (its PKI directory)
    pki: Path
    metrics_url: str


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    etcd = require_path("/usr/bin/etcd", "etcd (Debian's etcd-server)")
    root = tmp_path_factory.mktemp("etcd")
    pki_dir = root / "pki"
    pki.ensure(pki_dir, [pki.Member("local", "127.0.0.1")], ["local"])
    cert, key = pki.member_paths(pki_dir, "local")
    ca = pki.ca_paths(pki_dir)[0]
    client, peer, metrics = free_port(), free_port(), free_port()
    argv = [
        str(etcd), "--name", "local", "--data-dir", str(root / "data"),
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
    with (root / "etcd.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{metrics}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/health", timeout=1).json().get("health") == "true":
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None, (root / "etcd.log").read_text()[-2000:]
            time.sleep(0.2)
        else:
            pytest.fail("etcd not healthy after 30 s:\n" + (root / "etcd.log").read_text()[-2000:])
        coord = TopologyCoord(
            endpoints=[f"https://127.0.0.1:{client}"], **pki.controller_tls(pki_dir)
        )
        yield Store(coord, pki_dir, url)
    finally:
        stop_pid(proc)


def test_a_healthy_member_is_named_healthy_and_leader(store: Store) -> None:
    (member,) = health.member_health(store.coord)
    assert member == health.MemberHealth(store.coord.endpoints[0], True, "healthy (leader)", True)
    assert health.quorum([member])


def test_a_host_client_certificate_works_too(store: Store) -> None:
    cert, key = pki.client_paths(store.pki, "local")
    coord = store.coord.model_copy(update={"cert_file": str(cert), "key_file": str(key)})
    assert [m.healthy for m in health.member_health(coord)] == [True]


def test_a_client_without_a_certificate_is_refused(store: Store) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{store.coord.endpoints[0]}/health", verify=store.coord.ca_file, timeout=5)


def test_a_certificate_of_another_ca_is_refused_and_said_so(store: Store, tmp_path: Path) -> None:
    pki.ensure(tmp_path, [pki.Member("x", "127.0.0.1")], [])
    other = store.coord.model_copy(
        update={k: v for k, v in pki.controller_tls(tmp_path).items() if k != "ca_file"}
    )
    (member,) = health.member_health(other)
    assert not member.healthy and member.detail.startswith("TLS refused"), member.detail


def test_a_member_that_is_down_is_named_by_its_endpoint(store: Store) -> None:
    down = f"https://127.0.0.1:{free_port()}"
    coord = store.coord.model_copy(update={"endpoints": [*store.coord.endpoints, down, down]})
    members = health.member_health(coord, timeout=2)
    assert [m.healthy for m in members] == [True, False, False]
    assert members[1].endpoint == down and members[1].detail.startswith("unreachable")
    assert not health.quorum(members)


def test_metrics_answer_plain_http_for_prometheus(store: Store) -> None:
    text = requests.get(f"{store.metrics_url}/metrics", timeout=5).text
    assert "etcd_server_has_leader 1" in text
    assert "etcd_disk_wal_fsync_duration_seconds_bucket" in text
