"""The etcd store's certificates, made on the controller (`pdctl etcd pki`, run by pdstack_etcd).

One CA per deployment, whose key never leaves the controller's PKI directory; per [etcd]
member one certificate for both its client and peer listeners (server and client use: a member
dials its peers with it), with the member's address, 127.0.0.1 and localhost as SANs; per
inventory host a client certificate (CN = the host), and one for the controller. A second run
keeps every valid file and re-issues only what no longer fits (SANs changed, expiring, signed
by another CA, key and certificate apart), so site.yml reports no change on a steady fleet.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pdctl.errors import PdctlError
from pdctl.spec.text import host_problem

CA_DAYS = 3650
LEAF_DAYS = 825
# A certificate this close to its end is re-issued, so no run leaves one about to lapse.
RENEW_BEFORE = dt.timedelta(days=30)
CONTROLLER = "controller"  # the file stem of the controller's own client certificate
CONTROLLER_CN = "pdstack-controller"
CA_CN = "pdstack etcd CA"
# The deployment's --initial-cluster-token, made once beside the CA: two deployments' members
# never join each other, and preflight tells this cluster's data directories from others'.
TOKEN_FILE = "cluster-token"


@dataclass(frozen=True)
class Member:
    name: str
    address: str  # the inventory's ansible_host: an IPv4 address or a DNS name


def ca_paths(pki: Path) -> tuple[Path, Path]:
    return pki / "ca.crt", pki / "ca.key"


def member_paths(pki: Path, name: str) -> tuple[Path, Path]:
    return pki / f"member-{name}.crt", pki / f"member-{name}.key"


def client_paths(pki: Path, name: str) -> tuple[Path, Path]:
    return pki / f"client-{name}.crt", pki / f"client-{name}.key"


def cluster_token(pki: Path, changed: list[str] | None = None) -> str:
    """The token in `pki`, made when missing (then its name is added to `changed`)."""
    path = pki / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        token = f"pdstack-{secrets.token_hex(8)}"
        _write(path, f"{token}\n".encode(), 0o644)
        if changed is not None:
            changed.append(TOKEN_FILE)
    return token


def controller_tls(pki: Path) -> dict[str, str]:
    """The controller's TLS files, as pdctl.topology.TopologyCoord names them."""
    cert, key = pki / f"{CONTROLLER}.crt", pki / f"{CONTROLLER}.key"
    return {"ca_file": str(ca_paths(pki)[0]), "cert_file": str(cert), "key_file": str(key)}


def parse_member(text: str) -> Member:
    """NAME=ADDRESS, as `--member` takes it."""
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise PdctlError(f"--member {text!r}: write NAME=ADDRESS (the host and its ansible_host)")
    for what, value in (("name", name), ("address", address)):
        if problem := host_problem(value):
            raise PdctlError(f"--member {text!r}: the {what}: {problem}")
    return Member(name, address)


def _san(address: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(address))
    except ValueError:
        return x509.DNSName(address)


def member_sans(member: Member) -> set[x509.GeneralName]:
    """What a client or peer may dial the member by: its address and name, and loopback."""
    return {
        _san(member.address),
        x509.DNSName(member.name),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    }


class _Ca:
    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert, self.key = cert, key

    def signed(self, cert: x509.Certificate) -> bool:
        public = self.cert.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        if cert.issuer != self.cert.subject or cert.signature_hash_algorithm is None:
            return False
        try:
            public.verify(
                cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
            )
        except InvalidSignature:
            return False
        return True


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int) -> None:
    """Written beside and renamed: a reader never sees half a key."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _save(
    cert_path: Path, key_path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(key_path, pem, 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _load(
    cert_path: Path, key_path: Path
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The pair, or None when either is missing, unreadable or they do not belong together."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        return None
    return cert, key


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # hosts whose clocks lag a little
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _ensure_ca(pki: Path, changed: list[str]) -> _Ca:
    cert_path, key_path = ca_paths(pki)
    found = _load(cert_path, key_path)
    if found and found[0].not_valid_after_utc - RENEW_BEFORE > _now():
        return _Ca(*found)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_CN)])
    cert = (
        _builder(CA_CN, name, key, CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _save(cert_path, key_path, cert, key)
    changed.append(cert_path.name)
    return _Ca(cert, key)


def _fits(cert: x509.Certificate, ca: _Ca, cn: str, sans: set[x509.GeneralName]) -> bool:
    if not ca.signed(cert) or cert.not_valid_after_utc - RENEW_BEFORE <= _now():
        return False
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [a.value for a in names] != [cn]:
        return False
    try:
        have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        have = set()
    return have == sans


def _ensure_leaf(
    paths: tuple[Path, Path],
    ca: _Ca,
    cn: str,
    sans: set[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    changed: list[str],
) -> None:
    found = _load(*paths)
    if found and _fits(found[0], ca, cn, sans):
        return
    key = _new_key()
    builder = (
        _builder(cn, ca.cert.subject, key, LEAF_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if sans:
        # Sorted: the same inputs make the same extension, whatever the set's order.
        builder = builder.add_extension(
            x509.SubjectAlternativeName(sorted(sans, key=str)), critical=False
        )
    _save(*paths, builder.sign(ca.key, hashes.SHA256()), key)
    changed.append(paths[0].name)


SERVER_AND_CLIENT = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
CLIENT = [ExtendedKeyUsageOID.CLIENT_AUTH]


def ensure(pki: Path, members: Sequence[Member], clients: Sequence[str]) -> list[str]:
    """Make what is missing or no longer fits under `pki`; the names of the files (re)issued.

    A new CA (none yet, or expiring) re-issues every certificate: the old ones no longer
    verify against it.
    """
    if not members:
        raise PdctlError("no --member given: the store needs at least one [etcd] host")
    names = [m.name for m in members]
    for group, listed in (("--member", names), ("--client", list(clients))):
        dup = sorted({n for n in listed if listed.count(n) > 1})
        if dup:
            raise PdctlError(f"{group} names {', '.join(dup)} twice: one entry per host")
    for name in clients:
        if problem := host_problem(name):
            raise PdctlError(f"--client {name!r}: {problem}")
    if CONTROLLER in clients:
        raise PdctlError(
            f"--client {CONTROLLER!r}: the name of the controller's own certificate; "
            "rename that inventory host"
        )
    try:
        pki.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(pki, 0o700)  # it holds the CA's key
    except OSError as e:
        raise PdctlError(f"cannot create the PKI directory {pki}: {e.strerror}") from None
    changed: list[str] = []
    cluster_token(pki, changed)
    ca = _ensure_ca(pki, changed)
    for m in members:
        _ensure_leaf(
            member_paths(pki, m.name), ca, m.name, member_sans(m), SERVER_AND_CLIENT, changed
        )
    for name in clients:
        _ensure_leaf(client_paths(pki, name), ca, name, set(), CLIENT, changed)
    tls = controller_tls(pki)
    _ensure_leaf(
        (Path(tls["cert_file"]), Path(tls["key_file"])), ca, CONTROLLER_CN, set(), CLIENT, changed
    )
    return changed
