"""The fleet restart lock: one key in etcd, `pdstack/lock/restart`, under a lease.

Taken in a transaction only if the key does not exist (create revision 0), attached to a
lease of the configured ttl that the holder's heartbeat renews (pdctl.ops.lock). A holder
that stops renewing (killed, paused, cut off) loses the lease after ttl and etcd deletes the
key: the next restarter simply takes it. The key's value says who holds it in structured
fields (host, PID, command, the targets it restarts, start time); every decision about a
holder reads those fields (recovery's containment reads `targets`), never its display text.
A restart checks before each step that the key is still under its own lease (`check`), so a
holder that lost it stops before touching another pair. Breaking the lock revokes the lease
that was read, which deletes the key only if it is still under that lease.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass

from pydantic import AliasChoices, BaseModel, Field, ValidationError

from pdctl.coord.kv import KV, Entry, Guard, StoreUnavailable

KEY = "lock/restart"
WHAT_MAX = 2000  # characters of the holder's command line kept in the key


class HolderValue(BaseModel):
    """The lock key's value (JSON). Fields a newer pdctl adds are ignored; `targets` is empty
    in a record of a pdctl before it (its holder's targets are unknown)."""

    host: str
    pid: int
    # "what" until pdstack 0.4: an older holder's record reads the same
    command: str = Field(validation_alias=AliasChoices("command", "what"))
    targets: list[str] = []  # what it restarts: pairs/groups (HOST/NAME), instances, gateways
    since: float  # the holder's time.time() when it took the lock
    ttl_s: float  # its lease's


@dataclass(frozen=True)
class Holder:
    pid: int | None
    what: str  # the command that holds it ("pdctl restart --both --pair pd0")
    since: float  # when it took the lock (time.time(), the holder's clock for the fleet lock)
    host: str | None = None  # the fleet lock's holder's host; None: the host lock
    heartbeat_age_s: float | None = None  # fleet lock: since its last renewal
    ttl_s: float | None = None  # fleet lock: the lease's ttl
    lease: int | None = None  # fleet lock: the etcd lease that holds the key
    targets: tuple[str, ...] = ()  # fleet lock: what it restarts (empty: unknown)

    def describe(self) -> str:
        """In one line: pdf1 PID 4242 pdctl restart --both --pair pd0, since 12:01:05."""
        who = f"{self.host} PID {self.pid}" if self.host else f"PID {self.pid}"
        return f"{who} {self.what}, since {time.strftime('%H:%M:%S', time.localtime(self.since))}"


@dataclass(frozen=True)
class Grant:
    lease: int  # the etcd lease the key is under: this restart's token


class RestartLock:
    """The fleet restart lock in `store`, with leases of `ttl_s`."""

    def __init__(self, store: KV, ttl_s: float) -> None:
        self.store, self.ttl_s = store, ttl_s
        # The heartbeat renews every ttl/3; one renewal must not take longer than that.
        self.timeout = ttl_s / 3

    def describe(self) -> str:
        return f"the fleet restart lock in {self.store.describe()}"

    def _holder(self, entry: Entry) -> Holder:
        try:
            v = HolderValue.model_validate_json(entry.value)
        except ValidationError:
            raw = entry.value.decode(errors="replace")[:80]
            return Holder(None, f"unreadable holder {raw!r}", time.time(), "?", lease=entry.lease)
        left = self.store.time_to_live(entry.lease) if entry.lease else 0
        age = max(0.0, v.ttl_s - left)
        return Holder(
            v.pid, v.command, v.since, v.host, age, v.ttl_s, entry.lease, tuple(v.targets)
        )

    def holder(self) -> Holder | None:
        entry = self.store.get(KEY)
        return self._holder(entry) if entry else None

    def acquire(self, what: str, targets: list[str] | None = None) -> Grant | Holder:
        """The lock (a Grant) for the command `what` restarting `targets`, or who holds it."""
        if len(what) > WHAT_MAX:  # a roll of very many pairs: `targets` has them all
            what = what[: WHAT_MAX - 1] + "…"
        value = HolderValue(
            host=socket.gethostname(),
            pid=os.getpid(),
            command=what,
            targets=targets or [],
            since=time.time(),
            ttl_s=self.ttl_s,
        )
        lease = self.store.grant(self.ttl_s)
        try:
            ok, entry = self.store.create(KEY, value.model_dump_json().encode(), lease)
        except StoreUnavailable:
            self._revoke(lease)
            raise
        # Under our own lease: the transaction was committed, but its answer lost (etcd says
        # "request timed out" when it cannot tell), and Store retried it at another member.
        if ok or (entry is not None and entry.lease == lease):
            return Grant(lease)
        self._revoke(lease)
        if entry is None:  # released between the two reads: the caller tries again
            return Holder(None, "(released just now)", time.time(), "?")
        return self._holder(entry)

    def _revoke(self, lease: int) -> None:
        with contextlib.suppress(StoreUnavailable):  # else it expires after ttl by itself
            self.store.revoke(lease)

    def renew(self, grant: Grant) -> tuple[bool, Holder | None]:
        """(True, None) while the lock is ours; else (False, who holds it now, None: nobody)."""
        if self.store.keepalive(grant.lease) > 0:
            lost = self.check(grant)
            if lost is None:
                return True, None
        return False, self.holder()

    def check(self, grant: Grant) -> str | None:
        """Why the lock is no longer this restart's, or None while it is (the fencing check
        before each step: a read of the key, answered by the leader)."""
        entry = self.store.get(KEY)
        if entry is not None and entry.lease == grant.lease:
            return None
        if entry is None:
            return "its lease expired and nobody holds the lock now"
        return f"its lease expired and {self._holder(entry).describe()} holds the lock now"

    def release(self, grant: Grant) -> None:
        self.store.delete_if(KEY, Guard(KEY, grant.lease))
        self._revoke(grant.lease)

    def force_break(self) -> Holder | None:
        """End the lease of the holder read here, or None when nobody holds the lock.

        Only what was read is ended: revoking that lease deletes the key only while it is
        under it (one step in etcd), so a restarter that took the lock in between keeps it.
        A key without a lease (written by hand) is deleted only at the revision read."""
        entry = self.store.get(KEY)
        if entry is None:
            return None
        held = self._holder(entry)
        if entry.lease:
            self.store.revoke(entry.lease)
        else:
            self.store.delete_if_revision(KEY, entry.mod_revision)
        return held


def holder_json(h: Holder | None) -> dict[str, object] | None:
    """For --format json (pdctl lock show, status)."""
    if h is None:
        return None
    return {
        "host": h.host,
        "pid": h.pid,
        "command": h.what,
        "since": h.since,
        "held_s": round(time.time() - h.since, 1),
        "heartbeat_age_s": h.heartbeat_age_s,
        "ttl_s": h.ttl_s,
        "lease": h.lease,
        "targets": list(h.targets),
    }
