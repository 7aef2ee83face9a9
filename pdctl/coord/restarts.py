"""Restarts in progress: `pdstack/restarts/TARGET`, one key per pair or group a restart is
working on, naming the phase it entered last and the lease of the lock it holds.

The keys are not attached to the lease: they outlive a restarter that dies (killed, its host
lost), which is the point. Each write is conditional on the fleet restart lock still being
under the writer's lease (KV.put_if), so a restarter that lost the lock cannot overwrite
what its successor writes, and the record's end (the pair registered, or the restart failed
and said so) is a conditional delete. A record whose lease no longer holds the lock is an
abandoned restart: `pdctl finish` (the pdstack-finish timer on every host) finishes or undoes
it (pdctl.ops.finish).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from pdctl.coord import lock
from pdctl.coord.kv import KV, Guard

PREFIX = "restarts/"


class PhaseRecord(BaseModel):
    """A key's value (JSON); fields a newer pdctl adds are ignored."""

    target: str  # the pair or group (HOST/NAME)
    phase: str  # the step it entered last (pdctl.ops.report.PHASES)
    host: str  # the restarter's
    pid: int
    command: str
    lease: int  # of the fleet restart lock it held
    since: float  # when it entered the phase (the restarter's time.time())


@dataclass(frozen=True)
class Abandoned:
    record: PhaseRecord
    mod_revision: int  # what the reader saw: clearing it is conditional on this

    def describe(self) -> str:
        """abandoned restart of node-a/pd0 at phase stop by ctl PID 4242 (since 12:01:05)."""
        r = self.record
        at = time.strftime("%H:%M:%S", time.localtime(r.since))
        return (
            f"abandoned restart of {r.target} at phase {r.phase} by {r.host} PID {r.pid} "
            f"(since {at})"
        )


class Phases:
    """The phase records of one holder of the fleet restart lock (`lease`)."""

    def __init__(self, store: KV, lease: int, command: str) -> None:
        self.store, self.command = store, command
        self.guard = Guard(lock.KEY, lease)

    def enter(self, target: str, phase: str) -> bool:
        """Record that `target` enters `phase`; False (nothing written) when the lock is no
        longer this holder's."""
        rec = PhaseRecord(
            target=target,
            phase=phase,
            host=socket.gethostname(),
            pid=os.getpid(),
            command=self.command,
            lease=self.guard.lease,
            since=time.time(),
        )
        return self.store.put_if(PREFIX + target, rec.model_dump_json().encode(), self.guard)

    def done(self, target: str) -> bool:
        """`target`'s restart ended (it said how): its record goes, while the lock is ours."""
        return self.store.delete_if(PREFIX + target, self.guard)


def abandoned(store: KV) -> list[Abandoned]:
    """The records whose lease no longer holds the fleet restart lock, by target. Read in
    two calls: a record written after the lock's read belongs to its holder (or a later one)
    and counts as abandoned only if its lease differs from the one read, which a finisher
    re-checks under the lock before it acts."""
    held = store.get(lock.KEY)
    live = held.lease if held is not None else 0
    out = []
    for e in store.list(PREFIX):
        try:
            rec = PhaseRecord.model_validate_json(e.value)
        except ValidationError:
            continue  # not ours to judge; `pdctl doctor` does not act on it either
        if rec.lease != live:
            out.append(Abandoned(rec, e.mod_revision))
    return sorted(out, key=lambda a: a.record.target)


def clear(store: KV, a: Abandoned) -> bool:
    """Delete an abandoned record as it was read (not one a restart has written since)."""
    return store.delete_if_revision(PREFIX + a.record.target, a.mod_revision)
