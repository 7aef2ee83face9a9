"""The coordination store: etcd's v3 JSON gateway (etcd3gw), over every [etcd] member. It
implements pdctl.coord.kv.KV, whose docstrings say what each operation guarantees.

One client per member. A call goes to the member that answered last and moves on to the
next when one does not answer, so the loss of any one member costs a connect timeout, not a
restart. When no member can serve a call, the members are asked for their status (answered
locally, without a leader), so the error tells "no quorum" from "nothing answers" and from a
TLS refusal. Keys are relative to the prefix (`pdstack/`); values are bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import (
    ConnectionFailedError,
    ConnectionTimeoutError,
    Etcd3Exception,
)

from pdctl import names
from pdctl.coord.kv import Entry, Guard, StoreUnavailable
from pdctl.errors import PdctlError
from pdctl.topology import TopologyCoord

T = TypeVar("T")
# (connect, read): a powered-off member costs the connect timeout; a write etcd cannot commit
# (no leader) is given up after the read timeout.
TIMEOUT = (1.0, 3.0)


@dataclass(frozen=True)
class MemberStatus:
    endpoint: str
    answers: bool
    leader: bool = False  # this member knows a leader (0 in etcd's status: none)
    is_leader: bool = False
    error: str | None = None


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _client(endpoint: str, coord: TopologyCoord, timeout: Any) -> Etcd3Client:
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname or not url.port:
        raise PdctlError(f"bad etcd endpoint {endpoint!r}: use https://ADDRESS:PORT")
    tls = url.scheme == "https"
    # etcd3gw puts the CA on its Session, and requests lets REQUESTS_CA_BUNDLE (set system-wide
    # on many hosts) replace a Session's `verify`: the store's private CA would never be used.
    # A session that ignores the environment keeps it (and no proxy variable reroutes etcd).
    session = requests.Session()
    session.trust_env = False
    if tls:
        session.verify = coord.ca_file
        session.cert = (coord.cert_file, coord.key_file)
    return Etcd3Client(
        host=url.hostname,
        port=url.port,
        protocol=url.scheme,
        timeout=timeout,
        api_path="/v3/",
        session=session,
    )


def _reason(e: Etcd3Exception) -> str:
    text = (e.detail_text or str(e) or type(e).__name__).strip()
    if "database space exceeded" in text:  # etcd's NOSPACE alarm: it takes no write at all
        return (
            "etcd is out of space (NOSPACE alarm: its quota is reached); compact, defragment "
            "and disarm it (docs/runbook.md#pdetcddatabasequotalowspace)"
        )
    if "SSL" in text or "CERTIFICATE" in text.upper():
        return "TLS refused (a wrong CA or client certificate?)"
    if isinstance(e, ConnectionTimeoutError):
        return "timed out"
    if isinstance(e, ConnectionFailedError):
        return "refused" if "refused" in text.lower() else "does not answer"
    return text[:200]


class Store:
    def __init__(self, coord: TopologyCoord, timeout: Any = TIMEOUT) -> None:
        if not coord.endpoints:
            raise PdctlError("the topology names no etcd member (an empty [etcd] group)")
        self.coord = coord
        self.endpoints = list(coord.endpoints)
        self.prefix = coord.prefix
        self._clients = [_client(ep, coord, timeout) for ep in self.endpoints]
        self._first = 0  # the member that answered last

    def describe(self) -> str:
        return f"etcd ({', '.join(self.endpoints)})"

    def _call(self, what: str, fn: Callable[[Etcd3Client], T]) -> T:
        n, errors = len(self._clients), []
        for k in range(n):
            i = (self._first + k) % n
            try:
                out = fn(self._clients[i])
            except (ConnectionFailedError, ConnectionTimeoutError) as e:
                errors.append(f"{self.endpoints[i]} {_reason(e)}")
                continue
            except Etcd3Exception as e:  # the member answered: our request is wrong
                raise StoreUnavailable(f"etcd refused to {what}: {_reason(e)}") from None
            self._first = i
            return out
        raise StoreUnavailable(f"cannot {what}: {self.why_down(errors)}")

    def why_down(self, errors: list[str]) -> str:
        """One line: why no member could serve (after every member failed a call)."""
        statuses = self.members()
        answering = [s for s in statuses if s.answers]
        tls = [s for s in statuses if s.error and s.error.startswith("TLS")]
        if tls and not answering:
            return (
                f"etcd refused this client's TLS at {', '.join(s.endpoint for s in tls)}: check "
                f"the CA {self.coord.ca_file} and the client certificate {self.coord.cert_file}"
            )
        if answering:
            return (
                f"etcd has no quorum: {len(answering)} of {len(statuses)} members answer "
                f"({', '.join(s.endpoint for s in answering)}) and "
                + ("none knows a leader" if not any(s.leader for s in answering) else "fail")
                + f"; down: {', '.join(s.endpoint for s in statuses if not s.answers) or 'none'}"
            )
        return (
            f"no etcd member answers ({'; '.join(errors)}): check that {names.ETCD_UNIT} runs "
            "on the [etcd] hosts and that their firewall lets this host in"
        )

    def members(self) -> list[MemberStatus]:
        """Every member's own status, asked of each one directly (no leader needed)."""
        out = []
        for ep, c in zip(self.endpoints, self._clients, strict=True):
            try:
                st = c.status()
            except Etcd3Exception as e:
                out.append(MemberStatus(ep, False, error=_reason(e)))
                continue
            leader = int(st.get("leader", 0) or 0)
            member = int(st.get("header", {}).get("member_id", 0) or 0)
            out.append(MemberStatus(ep, True, leader != 0, leader != 0 and leader == member))
        return out

    def member_list(self) -> list[dict[str, Any]]:
        """The store's members as the gateway lists them (each member answers from its own
        view, no quorum needed): ID, name, peerURLs, clientURLs."""
        res = self._call(
            "list the members", lambda c: c.post(c.get_url("/cluster/member/list"), json={})
        )
        return list(res.get("members", []))

    # ----- keys and leases --------------------------------------------------------------
    def _key(self, key: str) -> str:
        return self.prefix + key

    def _entry(self, kv: dict[str, Any]) -> Entry:
        return Entry(
            key=_unb64(kv["key"]).decode()[len(self.prefix) :],
            value=_unb64(kv.get("value", "")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            lease=int(kv.get("lease", 0)),
        )

    def get(self, key: str) -> Entry | None:
        res = self._call("read", lambda c: c.post(c.get_url("/kv/range"), json=self._range(key)))
        kvs = res.get("kvs", [])
        return self._entry(kvs[0]) if kvs else None

    def _range(self, key: str, prefix: bool = False, **extra: Any) -> dict[str, Any]:
        full = self._key(key).encode()
        body: dict[str, Any] = {"key": _b64(full), **extra}
        if prefix:  # [key, key with its last byte + 1): every key starting with it
            body["range_end"] = _b64(full[:-1] + bytes([full[-1] + 1]))
        return body

    def list(
        self,
        prefix: str,
        limit: int = 0,
        newest_first: bool = False,
        keys_only: bool = False,
        serializable: bool = False,
    ) -> list[Entry]:
        """The keys under `prefix`, in key order (or the reverse), at most `limit` (0: all).
        `serializable`: from the answering member's own copy, without asking the leader (it
        may lag by what the member has not applied yet; it answers without quorum)."""
        body = self._range(
            prefix,
            True,
            limit=limit,
            sort_target="KEY",
            keys_only=keys_only,
            serializable=serializable,
        )
        body["sort_order"] = "DESCEND" if newest_first else "ASCEND"
        res = self._call("read", lambda c: c.post(c.get_url("/kv/range"), json=body))
        return [self._entry(kv) for kv in res.get("kvs", [])]

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(self._key(key)), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        self._call("write", lambda c: c.post(c.get_url("/kv/put"), json=body))

    def delete_before(self, prefix: str, end: str) -> None:
        """Every key under `prefix` that sorts before `end` (a key under it)."""
        body = {"key": _b64(self._key(prefix)), "range_end": _b64(self._key(end))}
        self._call("write", lambda c: c.post(c.get_url("/kv/deleterange"), json=body))

    def create(self, key: str, value: bytes, lease: int) -> tuple[bool, Entry | None]:
        """Put `key` only if it does not exist (create revision 0), in one transaction:
        (True, None), or (False, the entry that holds it)."""
        k = _b64(self._key(key))
        txn = {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": k, "value": _b64(value), "lease": lease}}],
            "failure": [{"request_range": {"key": k}}],
        }
        res = self._call("write", lambda c: c.post(c.get_url("/kv/txn"), json=txn))
        if res.get("succeeded"):
            return True, None
        kvs = res.get("responses", [{}])[0].get("response_range", {}).get("kvs", [])
        return False, self._entry(kvs[0]) if kvs else None

    def _txn(self, compare: dict[str, Any], success: dict[str, Any]) -> bool:
        """One transaction: `success` only if `compare` holds; whether it did."""
        txn = {"compare": [compare], "success": [success]}
        res = self._call("write", lambda c: c.post(c.get_url("/kv/txn"), json=txn))
        return bool(res.get("succeeded"))

    def _held(self, guard: Guard) -> dict[str, Any]:
        g = _b64(self._key(guard.key))
        return {"key": g, "result": "EQUAL", "target": "LEASE", "lease": guard.lease}

    def delete_if(self, key: str, guard: Guard) -> bool:
        delete = {"request_delete_range": {"key": _b64(self._key(key))}}
        return self._txn(self._held(guard), delete)

    def delete_if_revision(self, key: str, mod_revision: int) -> bool:
        k = _b64(self._key(key))
        same = {"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": mod_revision}
        return self._txn(same, {"request_delete_range": {"key": k}})

    def put_if_revision(self, key: str, value: bytes, mod_revision: int) -> bool:
        k = _b64(self._key(key))
        # etcd gives a key that does not exist mod revision 0, so 0 means "create".
        same = {"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": mod_revision}
        return self._txn(same, {"request_put": {"key": k, "value": _b64(value)}})

    def put_if(self, key: str, value: bytes, guard: Guard) -> bool:
        put = {"request_put": {"key": _b64(self._key(key)), "value": _b64(value)}}
        return self._txn(self._held(guard), put)

    def grant(self, ttl_s: float) -> int:
        ttl = max(1, round(ttl_s))
        res = self._call(
            "grant a lease", lambda c: c.post(c.get_url("/lease/grant"), json={"TTL": ttl})
        )
        return int(res["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's ttl after renewing it; 0 when it is gone (expired or revoked)."""
        res = self._call(
            "renew a lease", lambda c: c.post(c.get_url("/lease/keepalive"), json={"ID": lease})
        )
        return max(0, int(res.get("result", {}).get("TTL", 0)))

    def time_to_live(self, lease: int) -> int:
        """Seconds the lease has left; 0 when it is gone."""
        res = self._call(
            "read a lease", lambda c: c.post(c.get_url("/kv/lease/timetolive"), json={"ID": lease})
        )
        return max(0, int(res.get("TTL", 0)))

    def revoke(self, lease: int) -> None:
        def revoke(c: Etcd3Client) -> None:
            try:
                c.post(c.get_url("/kv/lease/revoke"), json={"ID": lease})
            except Etcd3Exception as e:  # expired or revoked by another since it was read
                if "lease not found" not in (e.detail_text or str(e)):
                    raise

        self._call("revoke a lease", revoke)
