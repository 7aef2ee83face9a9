"""The gateways' liveness keys: `pdstack/gateways/HOST`, each under a lease its host renews
while the gateway unit runs (`pdctl gateway heartbeat`, pdstack-gateway-lease.service).

A restart that cannot reach a gateway asks here: no key means the gateway's host stopped
renewing for longer than the ttl (lost, powered off) or its gateway was stopped, so the
restart goes on without it, saying so. A gateway that still has its key but does not answer
blocks the restart: it may still be serving clients.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, ValidationError

from pdctl.coord.kv import KV, Entry, StoreUnavailable

PREFIX = "gateways/"


class GatewayKey(BaseModel):
    host: str
    url: str
    since: float  # the host's time.time() when its heartbeat started


class Keys(Protocol):
    """What `alive` reads: KV's list (tests hand in fakes of it alone)."""

    def list(self, prefix: str, *, serializable: bool = False) -> list[Entry]: ...


def alive(store: Keys) -> dict[str, GatewayKey]:
    """The gateways that hold their key now, by inventory host. A serializable read: any
    member answers it from its own copy, without a leader (a lease does not expire without
    one either, so a store without quorum says every key is still held)."""
    out = {}
    for e in store.list(PREFIX, serializable=True):
        try:
            k = GatewayKey.model_validate_json(e.value)
        except ValidationError:
            continue
        out[k.host] = k
    return out


def heartbeat(
    store: KV,
    host: str,
    url: str,
    ttl_s: float,
    stop: threading.Event,
    say: Callable[[str], None],
) -> None:
    """Keep `host`'s key under a lease until `stop` is set, then revoke it (a gateway that is
    stopped is gone at once, not after the ttl). Outages of etcd are waited out: the key is
    put again under a new lease once etcd serves again."""
    value = GatewayKey(host=host, url=url, since=time.time()).model_dump_json().encode()
    lease, down = 0, False
    while True:
        try:
            if lease == 0 or store.keepalive(lease) == 0:
                lease = store.grant(ttl_s)
                store.put(PREFIX + host, value, lease)
                where = f"{PREFIX}{host} in {store.describe()}"
                say(f"{host}: gateway key {where} held (ttl {ttl_s:g}s)")
            elif down:
                say(f"{host}: gateway key renewed again")
            down = False
        except StoreUnavailable as e:
            if not down:
                say(f"{host}: cannot renew the gateway key: {e}")
            down = True
        if stop.wait(ttl_s / 3):
            break
    if lease:
        try:
            store.revoke(lease)
        except StoreUnavailable as e:
            say(f"{host}: could not revoke the gateway key ({e}); it expires after {ttl_s:g}s")
