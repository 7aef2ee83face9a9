"""Each etcd member's health, asked one by one (`pdctl doctor`): which member is down, and why.

A member is healthy when its /health says so over mutual TLS with this host's client
certificate: in etcd 3.4 that needs a leader and a quorum read through the cluster, so a
member that answers but is cut off from the majority counts as unhealthy. The status call adds
who leads, as that member sees it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from pdctl.topology import TopologyCoord

TIMEOUT_S = 3.0


@dataclass(frozen=True)
class MemberHealth:
    endpoint: str  # the member's client URL, as the topology lists it
    healthy: bool
    detail: str  # one line: "healthy (leader)", "unreachable: ...", "TLS refused: ..."
    leader: bool | None = None  # None: unknown (the member did not answer its status)


def _tls(coord: TopologyCoord) -> dict[str, Any]:
    """Per request: a Session's own `verify` loses to REQUESTS_CA_BUNDLE from the environment."""
    return {"verify": coord.ca_file, "cert": (coord.cert_file, coord.key_file)}


def _json(r: requests.Response) -> dict[str, Any]:
    try:
        data = r.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _probe(tls: dict[str, Any], endpoint: str, timeout: float) -> MemberHealth:
    try:
        r = requests.get(f"{endpoint}/health", timeout=timeout, **tls)
        health = _json(r)
        status = requests.post(f"{endpoint}/v3/maintenance/status", json={}, timeout=timeout, **tls)
    except requests.exceptions.SSLError as e:
        return MemberHealth(
            endpoint,
            False,
            f"TLS refused ({_reason(e)}): check the CA and this host's client certificate "
            "(site.yml installs them; a controller uses its PKI directory)",
        )
    except requests.exceptions.Timeout:
        return MemberHealth(endpoint, False, f"no answer within {timeout:g}s")
    except requests.exceptions.ConnectionError as e:
        return MemberHealth(endpoint, False, f"unreachable ({_reason(e)})")
    except OSError as e:  # a TLS file that cannot be read
        return MemberHealth(endpoint, False, f"cannot use the TLS files: {e}")
    info = _json(status)
    member = str(info.get("header", {}).get("member_id", ""))
    leader = bool(member) and member == str(info.get("leader", ""))
    if r.status_code == 200 and str(health.get("health")) == "true":
        return MemberHealth(endpoint, True, "healthy" + (" (leader)" if leader else ""), leader)
    why = health.get("reason") or r.text.strip()[:200] or f"HTTP {r.status_code}"
    return MemberHealth(
        endpoint, False, f"unhealthy: {why} (no leader, or cut off from the majority)", leader
    )


def _reason(e: Exception) -> str:
    """The innermost cause's text, not urllib3's retry wrapper around it."""
    while e.__context__ is not None and isinstance(e.__context__, Exception):
        e = e.__context__
    text = str(e) or type(e).__name__
    return text.rsplit(": ", 1)[-1][:160]


def member_health(coord: TopologyCoord, timeout: float = TIMEOUT_S) -> list[MemberHealth]:
    """Every endpoint's health, in the topology's order, asked concurrently (each bounded by
    `timeout`, so one dead member costs one timeout, not one per member)."""
    tls = _tls(coord)
    with ThreadPoolExecutor(max_workers=max(1, len(coord.endpoints))) as pool:
        return list(pool.map(lambda e: _probe(tls, e, timeout), coord.endpoints))


def quorum(members: list[MemberHealth]) -> bool:
    """Whether a majority of the members is healthy."""
    return sum(m.healthy for m in members) > len(members) // 2
