"""The store's PKI (`pdctl etcd pki`): what it makes, what a second run keeps, what it
re-issues, and the one-line errors for bad input."""

from __future__ import annotations

import ipaddress
import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pdctl.coord import pki
from pdctl.errors import PdctlError
from tests.conftest import Run

MEMBERS = [pki.Member("e1", "10.0.0.1"), pki.Member("e2", "host-2.example")]
CLIENTS = ["e1", "e2", "gw"]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(cert: x509.Certificate) -> set[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(getattr(n, "value", n)) for n in ext}


def test_first_run_makes_a_ca_members_clients_and_the_controller(tmp_path: Path) -> None:
    changed = pki.ensure(tmp_path, MEMBERS, CLIENTS)
    assert changed[:2] == [pki.TOKEN_FILE, "ca.crt"]
    assert {"member-e1.crt", "member-e2.crt", "client-gw.crt", "controller.crt"} <= set(changed)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700  # it holds the CA key
    for key in tmp_path.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    ca = _cert(tmp_path / "ca.crt")
    member = _cert(tmp_path / "member-e1.crt")
    assert member.issuer == ca.subject
    assert _sans(member) == {"10.0.0.1", "e1", "127.0.0.1", "localhost"}
    assert _sans(_cert(tmp_path / "member-e2.crt")) >= {"host-2.example", "127.0.0.1"}
    usage = member.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # Members dial their peers with the same certificate: server and client use.
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    client = _cert(tmp_path / "client-gw.crt")
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gw"
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    controller = pki.controller_tls(tmp_path)
    assert Path(controller["cert_file"]).exists() and Path(controller["key_file"]).exists()


def test_a_second_run_keeps_every_file(tmp_path: Path) -> None:
    pki.ensure(tmp_path, MEMBERS, CLIENTS)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert pki.ensure(tmp_path, MEMBERS, CLIENTS) == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_member_whose_address_changed_is_reissued_alone(tmp_path: Path) -> None:
    pki.ensure(tmp_path, MEMBERS, CLIENTS)
    token = pki.cluster_token(tmp_path)
    moved = [pki.Member("e1", "10.0.0.9"), MEMBERS[1]]
    assert pki.ensure(tmp_path, moved, CLIENTS) == ["member-e1.crt"]
    assert ipaddress.ip_address("10.0.0.9") in {
        getattr(n, "value", None) for n in _cert(tmp_path / "member-e1.crt").extensions
        .get_extension_for_class(x509.SubjectAlternativeName).value
    }  # fmt: skip
    assert pki.cluster_token(tmp_path) == token  # the cluster stays the same cluster


def test_a_new_ca_reissues_everything_signed_by_the_old_one(tmp_path: Path) -> None:
    pki.ensure(tmp_path, MEMBERS, CLIENTS)
    (tmp_path / "ca.key").unlink()
    changed = pki.ensure(tmp_path, MEMBERS, CLIENTS)
    assert "ca.crt" in changed and "member-e1.crt" in changed and "client-gw.crt" in changed


def test_a_key_that_does_not_match_its_certificate_is_reissued(tmp_path: Path) -> None:
    pki.ensure(tmp_path, MEMBERS, CLIENTS)
    (tmp_path / "client-gw.key").write_bytes((tmp_path / "client-e1.key").read_bytes())
    assert pki.ensure(tmp_path, MEMBERS, CLIENTS) == ["client-gw.crt"]


@pytest.mark.parametrize(
    ("members", "clients", "message"),
    [
        ([], ["a"], "no --member given"),
        ([pki.Member("a", "10.0.0.1"), pki.Member("a", "10.0.0.2")], [], "--member names a twice"),
        ([pki.Member("a", "10.0.0.1")], ["b", "b"], "--client names b twice"),
        ([pki.Member("a", "10.0.0.1")], ["controller"], "the controller's own certificate"),
        ([pki.Member("a", "10.0.0.1")], ["-rf"], "--client '-rf'"),
    ],
)
def test_bad_input_is_one_clear_error_before_anything_is_written(
    tmp_path: Path, members: list[pki.Member], clients: list[str], message: str
) -> None:
    with pytest.raises(PdctlError, match=message):
        pki.ensure(tmp_path / "pki", members, clients)
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize("text", ["e1", "=10.0.0.1", "e1=", "e1=a b"])
def test_member_argument_needs_name_and_address(text: str) -> None:
    with pytest.raises(PdctlError, match="--member"):
        pki.parse_member(text)


def test_the_command_prints_what_changed_and_the_cluster_token(
    pdctl: Callable[..., Run], tmp_path: Path
) -> None:
    args = ["etcd", "pki", "--dir", str(tmp_path), "--member", "e1=10.0.0.1", "--client", "e1"]
    first = pdctl(*args)
    assert first.exit_code == 0, first.stderr
    out = json.loads(first.stdout)
    assert "member-e1.crt" in out["changed"] and out["cluster_token"].startswith("pdstack-")
    again = json.loads(pdctl(*args).stdout)
    assert again == {"changed": [], "cluster_token": out["cluster_token"]}
    bad = pdctl("etcd", "pki", "--dir", str(tmp_path), "--member", "e1")
    assert bad.exit_code == 2 and bad.stderr.strip().startswith("Error: --member 'e1'")
