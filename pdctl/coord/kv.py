"""What the lock, the restart records, the history and the liveness keys need of a store.

The one implementation is etcd (pdctl.coord.store.Store); tests may hand in others. As
patroni's AbstractDCS does, each operation says what is atomic about it, since every decision
about another process rests on that: a write to shared state is conditional on what the
writer last read (a lease it holds, or the revision it saw), never unconditional.

Keys are relative to the store's prefix; values are bytes. A lease ends (expires or is
revoked) with every key attached to it, in one step. Any operation raises StoreUnavailable
when the store cannot serve it (no quorum, no member answers, TLS refused, out of space);
a write that raised may still have been applied: callers read again before deciding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pdctl import exits
from pdctl.errors import PdctlError


class StoreUnavailable(PdctlError):
    """The store cannot serve the call (no member answers, no quorum, TLS refused)."""

    exit_code = exits.STORE_UNAVAILABLE


@dataclass(frozen=True)
class Entry:
    key: str  # relative to the prefix
    value: bytes
    create_revision: int
    mod_revision: int  # the store's revision of the last write to this key
    lease: int  # 0: none


@dataclass(frozen=True)
class Guard:
    """A write's condition: `key` is held under `lease` (the writer's fleet lock)."""

    key: str
    lease: int


class KV(Protocol):
    def describe(self) -> str: ...

    def get(self, key: str) -> Entry | None:
        """One key, linearizable (answered through the leader)."""
        ...

    def list(
        self,
        prefix: str,
        limit: int = 0,
        newest_first: bool = False,
        keys_only: bool = False,
        serializable: bool = False,
    ) -> list[Entry]:
        """The keys under `prefix` as of one revision (a consistent snapshot, never a mix).
        `serializable`: the answering member's own copy, which may lag the leader."""
        ...

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        """Unconditional: only for keys one writer owns (its own history record, its own
        liveness key). Never for a key another process may write."""
        ...

    def delete_before(self, prefix: str, end: str) -> None:
        """Every key under `prefix` sorting before `end`, in one revision."""
        ...

    def create(self, key: str, value: bytes, lease: int) -> tuple[bool, Entry | None]:
        """Put `key` under `lease` only if it does not exist, in one transaction: (True,
        None), or (False, the entry that holds it, read in the same transaction)."""
        ...

    def put_if(self, key: str, value: bytes, guard: Guard) -> bool:
        """Put `key` (no lease: it outlives the writer) only while `guard` holds, in one
        transaction: False, and nothing written, when it does not."""
        ...

    def put_if_revision(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put `key` (no lease) only if it was last written at `mod_revision` (what the caller
        read; 0: only if it does not exist), in one transaction: False, nothing written, when
        another writer came first."""
        ...

    def delete_if_revision(self, key: str, mod_revision: int) -> bool:
        """Delete `key` only if it was last written at `mod_revision` (what the caller read),
        in one transaction."""
        ...

    def delete_if(self, key: str, guard: Guard) -> bool:
        """Delete `key` only while `guard` holds (`guard.key` may be `key` itself: delete it
        only if it is still under that lease), in one transaction."""
        ...

    def grant(self, ttl_s: float) -> int:
        """A new lease of `ttl_s` (at least 1 s); its ID."""
        ...

    def keepalive(self, lease: int) -> int:
        """Renew `lease`: its ttl, or 0 when it is gone (nothing is renewed then)."""
        ...

    def time_to_live(self, lease: int) -> int:
        """Seconds `lease` has left; 0 when it is gone."""
        ...

    def revoke(self, lease: int) -> None:
        """End `lease` and delete every key attached to it, atomically; a lease that is
        gone already is not an error of the caller's (etcd answers "not found")."""
        ...
