"""A real one-member etcd (Debian's etcd-server) with the certificates `pdctl etcd pki` makes
(pdctl.testing.etcd, tls=True): mutual TLS as the role configures it, and
`pdctl.coord.health` naming each member's state."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from pdctl.coord import health, pki
from pdctl.coord.members import Wanted, check, running
from pdctl.coord.store import Store, StoreUnavailable
from pdctl.lint import Severity
from pdctl.ops import doctor
from pdctl.testing.etcd import LocalEtcd, local_etcd
from pdctl.testing.stack import free_port
from pdctl.topology import TopologyCoord


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    with local_etcd(tmp_path_factory.mktemp("etcd"), tls=True) as etcd:
        yield etcd


def test_a_healthy_member_is_named_healthy_and_leader(store: LocalEtcd) -> None:
    (member,) = health.member_health(store.coord)
    assert member == health.MemberHealth(store.coord.endpoints[0], True, "healthy (leader)", True)
    assert health.quorum([member])


def test_a_host_client_certificate_works_too(store: LocalEtcd) -> None:
    assert store.pki is not None
    cert, key = pki.client_paths(store.pki, "local")
    coord = store.coord.model_copy(update={"cert_file": str(cert), "key_file": str(key)})
    assert [m.healthy for m in health.member_health(coord)] == [True]


def test_a_client_without_a_certificate_is_refused(store: LocalEtcd) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{store.coord.endpoints[0]}/health", verify=store.coord.ca_file, timeout=5)


def test_a_certificate_of_another_ca_is_refused_and_said_so(
    store: LocalEtcd, tmp_path: Path
) -> None:
    pki.ensure(tmp_path, [pki.Member("x", "127.0.0.1")], [])
    other = store.coord.model_copy(
        update={k: v for k, v in pki.controller_tls(tmp_path).items() if k != "ca_file"}
    )
    (member,) = health.member_health(other)
    assert not member.healthy and member.detail.startswith("TLS refused"), member.detail


def test_a_member_that_is_down_is_named_by_its_endpoint(store: LocalEtcd) -> None:
    down = f"https://127.0.0.1:{free_port()}"
    coord = store.coord.model_copy(update={"endpoints": [*store.coord.endpoints, down, down]})
    members = health.member_health(coord, timeout=2)
    assert [m.healthy for m in members] == [True, False, False]
    assert members[1].endpoint == down and members[1].detail.startswith("unreachable")
    assert not health.quorum(members)


def test_metrics_answer_plain_http_for_prometheus(store: LocalEtcd) -> None:
    text = requests.get(f"{store.members[0].metrics_url}/metrics", timeout=5).text
    assert "etcd_server_has_leader 1" in text
    assert "etcd_disk_wal_fsync_duration_seconds_bucket" in text


def _ops(coord: TopologyCoord) -> Any:
    """What `doctor.store_findings` reads of an Ops: the topology's coord."""
    return SimpleNamespace(source=SimpleNamespace(topology=SimpleNamespace(coord=coord)))


def test_doctor_names_the_member_that_is_down(store: LocalEtcd) -> None:
    assert doctor.store_findings(_ops(store.coord)) == []
    down = f"https://127.0.0.1:{free_port()}"
    coord = store.coord.model_copy(update={"endpoints": [*store.coord.endpoints, down]})
    (finding,) = doctor.store_findings(_ops(coord))
    assert (finding.id, finding.severity, finding.where) == (
        "live-etcd",
        Severity.ERROR,
        down,
    )
    assert "unreachable" in finding.message and "no quorum" in finding.message


def test_the_store_client_uses_the_deployments_ca_whatever_the_environment(
    store: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests lets REQUESTS_CA_BUNDLE replace a Session's CA: the client must not."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    s = Store(store.coord)
    s.put("tls-check", b"ok")
    assert s.get("tls-check") is not None


def test_a_wrong_client_certificate_or_ca_is_one_line_naming_the_files(
    store: LocalEtcd, tmp_path: Path
) -> None:
    pki.ensure(tmp_path, [pki.Member("x", "127.0.0.1")], [])
    other = pki.controller_tls(tmp_path)
    for wrong in (
        {k: v for k, v in other.items() if k != "ca_file"},
        {"ca_file": other["ca_file"]},
    ):
        coord = store.coord.model_copy(update=wrong)
        with pytest.raises(StoreUnavailable) as e:
            Store(coord).get("k")
        assert str(e.value) == (
            f"cannot read: etcd refused this client's TLS at {store.coord.endpoints[0]}: check "
            f"the CA {coord.ca_file} and the client certificate {coord.cert_file}"
        ), wrong


def test_unreachable_endpoints_are_one_line_naming_each_and_what_to_check(
    store: LocalEtcd,
) -> None:
    down = [f"https://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(StoreUnavailable) as e:
        Store(store.coord.model_copy(update={"endpoints": down})).get("k")
    assert str(e.value) == (
        f"cannot read: no etcd member answers ({down[0]} refused; {down[1]} refused): check "
        "that pdstack-etcd.service runs on the [etcd] hosts and that their firewall lets this "
        "host in"
    )


def _etcdctl(etcd: LocalEtcd, *args: str) -> str:
    c = etcd.coord
    tls = [f"--cacert={c.ca_file}", f"--cert={c.cert_file}", f"--key={c.key_file}"]
    argv = ["etcdctl", f"--endpoints={c.endpoints[0]}", *tls, *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def test_the_member_set_changes_only_through_member_add_and_remove(tmp_path: Path) -> None:
    """A host added to [etcd] is refused until `member add`, then joins as `existing` (the
    procedure in docs/etcd.md); a member dropped from [etcd], or one that lost its data,
    is named with what to do. The member list answers without a quorum, too."""
    with local_etcd(tmp_path / "etcd", tls=True) as etcd:
        new = etcd.new_member()

        def problems(state: str = "new", **data: bool) -> list[str]:
            wanted = [
                Wanted(m.name, m.peer_url, data[m.name]) for m in etcd.members if m.name in data
            ]
            return check(wanted, running(etcd.coord), state)

        (line,) = problems(m0=True, m1=False)
        assert line.startswith("m1: in [etcd] but not a member of the running store: ")
        assert f"etcdctl member add m1 --peer-urls={new.peer_url}" in line
        _etcdctl(etcd, "member", "add", "m1", f"--peer-urls={new.peer_url}")
        (line,) = problems(m0=True, m1=False)
        assert line.startswith("m1: added to the store (member "), line
        assert problems("existing", m0=True, m1=False) == []

        etcd.start(1, state="existing")
        etcd.wait_healthy()
        listed = running(etcd.coord)
        assert listed is not None and sorted(m.name for m in listed if m.started) == ["m0", "m1"]
        assert problems(m0=True, m1=True) == []
        (line,) = problems(m0=True)  # [etcd] without m1, which the store still has
        m1 = next(m for m in listed if m.name == "m1")
        assert line.startswith(f"m1: member {m1.id:x} of the store ({new.peer_url}) is not in")

        etcd.stop(1)  # and its disk is lost: m0 alone has no quorum of 2, yet lists them
        shutil.rmtree(new.data_dir)
        (line,) = problems(m0=True, m1=False)
        assert line.startswith(f"m1: member {m1.id:x} of the store has no data on m1 (it lost")
        assert f"etcdctl member remove {m1.id:x}, then etcdctl member add m1" in line
