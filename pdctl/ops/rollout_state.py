"""A rollout's record in etcd, and the lease of the controller that drives it.

`pdstack/rollouts/current` holds the record (JSON, no lease: it outlives its controller).
Every write is conditional on the revision the writer read (KV.put_if_revision): a controller
that lost the race (another resumed, an operator paused) learns it at its next write and
stops; nothing is ever written over a record its writer has not seen. A record whose state is
done or undone is history: the next rollout writes over it (at its revision).

`pdstack/rollouts/controller` is the driving controller's key, under a lease it renews every
ttl/3 (created only if absent, as the restart lock is): while it exists, a rollout runs, and
nobody else may resume or undo it; a controller that dies (killed, its host lost) loses it
after ttl, and `pdctl rollout resume` on another machine takes over from the record.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Literal

from pydantic import BaseModel, ValidationError

from pdctl.coord.kv import KV, Guard, StoreUnavailable
from pdctl.errors import PdctlError
from pdctl.ops.gate import Figures
from pdctl.ops.release import Release
from pdctl.spec.profile import Rollout as Thresholds

KEY = "rollouts/current"
CONTROLLER = "rollouts/controller"

State = Literal["running", "paused", "failed", "done", "undone"]
LIVE: tuple[State, ...] = ("running", "paused", "failed")  # a new rollout is refused
WaveState = Literal["pending", "switching", "soaking", "passed", "rolled back"]


class GroupRelease(BaseModel):
    before: Release | None  # None: the unit's defaults (no drop-in)
    now: Release | None  # what its drop-ins say since its last switch


class Wave(BaseModel):
    groups: list[str]
    state: WaveState = "pending"
    new: dict[str, Figures] = {}  # the gate's figures, per group of the wave
    old: Figures | None = None  # and the old groups' (or the baseline's)
    verdict: list[str] = []  # the checks it failed


class Record(BaseModel):
    id: str
    target: Release
    state: State
    waves: list[Wave]
    groups: dict[str, GroupRelease]  # every group the rollout moves, by id
    max_unavailable: str = "1"
    decode_first: bool = False
    prometheus: str | None = None
    thresholds: Thresholds  # the gate's, as the profile set them when it started
    holder: str  # HOST PID of the controller that wrote it last
    message: str | None = None  # why it failed, paused or was undone
    started: float
    updated: float
    # The old groups' figures at the last gate that had old groups: the last wave (no group
    # left on the old release) is judged against them.
    baseline: Figures | None = None

    def waves_done(self) -> int:
        return sum(w.state == "passed" for w in self.waves)


def me() -> str:
    return f"{socket.gethostname()} PID {os.getpid()}"


class RecordChanged(PdctlError):
    """Another writer came first: this controller stops without writing."""


class Records:
    """The record with the revision it was read at."""

    def __init__(self, store: KV) -> None:
        self.store = store
        self.revision = 0  # what the next write is conditional on (0: none exists)

    def read(self) -> Record | None:
        entry = self.store.get(KEY)
        self.revision = 0 if entry is None else entry.mod_revision
        if entry is None:
            return None
        try:
            return Record.model_validate_json(entry.value)
        except ValidationError as e:
            raise PdctlError(
                f"the rollout record in {self.store.describe()} ({KEY}) is not one this pdctl "
                f"reads: {e.errors()[0]['msg']}"
            ) from None

    def write(self, rec: Record) -> None:
        """`rec` over what was read; RecordChanged when another writer came first."""
        rec.holder, rec.updated = me(), time.time()
        value = rec.model_dump_json().encode()
        if not self.store.put_if_revision(KEY, value, self.revision):
            now = self.read()
            who = "deleted it" if now is None else f"{now.holder} wrote it ({now.state})"
            raise RecordChanged(
                f"the rollout record changed under this controller: {who}; stopping here"
            )
        entry = self.store.get(KEY)
        if entry is None or entry.value != value:  # written over since: the next write fails
            self.revision = -1
            return
        self.revision = entry.mod_revision


class Controller:
    """The controller key under a renewed lease, for the `with` block; RolloutRunning when
    another controller holds it."""

    def __init__(self, store: KV, ttl_s: float) -> None:
        self.store, self.ttl_s = store, ttl_s
        self.lease = 0
        self.stopped = threading.Event()
        self.lost: str | None = None

    def __enter__(self) -> Controller:
        self.lease = self.store.grant(self.ttl_s)
        ok, entry = self.store.create(CONTROLLER, me().encode(), self.lease)
        if not ok and (entry is None or entry.lease != self.lease):
            self.store.revoke(self.lease)
            who = "another controller" if entry is None else entry.value.decode(errors="replace")
            raise RolloutRunning(f"a rollout is running: {who} drives it")
        threading.Thread(target=self._renew, name="rollout-controller", daemon=True).start()
        return self

    def _renew(self) -> None:
        while not self.stopped.wait(self.ttl_s / 3):
            try:
                if self.store.keepalive(self.lease) == 0:
                    self.lost = "its lease expired"
                    return
            except StoreUnavailable as e:
                self.lost = f"etcd cannot renew its lease: {e}"

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        try:
            self.store.delete_if(CONTROLLER, Guard(CONTROLLER, self.lease))
            self.store.revoke(self.lease)
        except StoreUnavailable:
            pass  # it frees itself ttl after the last renewal


def controller(store: KV) -> str | None:
    """Who drives a rollout now (HOST PID), None when no controller holds the key."""
    entry = store.get(CONTROLLER)
    return None if entry is None else entry.value.decode(errors="replace")


class RolloutRunning(PdctlError):
    """Another controller drives the rollout: refused, nothing changed."""
