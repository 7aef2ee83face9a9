"""The restart history: one key per restart under `pdstack/history/`, newest last.

Written when a restart takes the fleet lock (result "running") and again when it releases it.
A record still "running" when the next restarter takes the lock belongs to a holder whose
lease expired before it finished (killed, paused, cut off): the next one marks it "lost".
Bounded: the oldest records beyond KEEP are deleted when a new one is written.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Literal

from pydantic import BaseModel, ValidationError

from pdctl.coord.kv import KV

PREFIX = "history/"
KEEP = 500
Result = Literal["running", "ok", "failed", "lost"]


class Record(BaseModel):
    key: str
    host: str
    pid: int
    command: str
    started: float  # the restarter's time.time()
    ended: float | None = None
    result: Result = "running"
    error: str | None = None
    targets: list[str] = []  # pairs (HOST/NAME), instances or gateways
    phases: dict[str, dict[str, float]] = {}  # target -> phase -> seconds


class Outcome(BaseModel):
    """What a restart did, as its caller tells the lock before releasing it."""

    result: Result
    error: str | None = None
    targets: list[str] = []
    phases: dict[str, dict[str, float]] = {}


class History:
    def __init__(self, store: KV, keep: int = KEEP) -> None:
        self.store, self.keep = store, keep

    def _put(self, rec: Record) -> None:
        # Unconditional: only its restarter writes a record, but for the next holder's
        # "lost" mark, which follows the lease's end.
        self.store.put(rec.key, rec.model_dump_json().encode())

    def start(self, command: str, targets: list[str] | None = None) -> Record:
        now = time.time()
        host, pid = socket.gethostname(), os.getpid()
        rec = Record(
            key=f"{PREFIX}{time.time_ns():020d}-{host}-{pid}",
            host=host,
            pid=pid,
            command=command,
            started=now,
            targets=targets or [],
        )
        self._put(rec)
        self._prune()
        return rec

    def finish(self, rec: Record, outcome: Outcome) -> None:
        self._put(
            rec.model_copy(
                update={
                    "ended": time.time(),
                    "result": outcome.result,
                    "error": outcome.error,
                    "targets": outcome.targets,
                    "phases": outcome.phases,
                }
            )
        )

    def _prune(self) -> None:
        newest = self.store.list(PREFIX, limit=self.keep + 1, newest_first=True, keys_only=True)
        if len(newest) > self.keep:
            self.store.delete_before(PREFIX, newest[self.keep - 1].key)

    def records(self, limit: int = 0) -> list[Record]:
        """Newest first; unreadable records are skipped."""
        out = []
        for e in self.store.list(PREFIX, limit=limit, newest_first=True):
            try:
                out.append(Record.model_validate_json(e.value))
            except ValidationError:
                continue
        return out

    def mark_lost(self, current: Record) -> Record | None:
        """The last record before `current` if it was left "running": marked "lost"."""
        for rec in self.records(limit=2):
            if rec.key != current.key and rec.result == "running":
                lost = rec.model_copy(
                    update={
                        "result": "lost",
                        "error": "its lease expired before it finished (its holder was "
                        "killed, paused or cut off)",
                    }
                )
                self._put(lost)
                return lost
        return None
