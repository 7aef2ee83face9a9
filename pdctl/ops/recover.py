"""Automatic recovery: an engine unit's `OnFailure=pdstack-recover@PAIR.service` runs
`pdctl recover --pair PAIR`, the coordinated restart of the whole pair.

Rate-limited through a state file: after `max_count` recoveries of a pair within `window_s`
it does nothing, says why, and exits non-zero, leaving the failed unit failed so the alert
fires instead of the pair flapping.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdctl.errors import PdctlError
from pdctl.ops import lock
from pdctl.ops.context import Ops
from pdctl.ops.restart import Report, restart_pair
from pdctl.ops.source import Pair

DEFAULT_STATE = Path("/var/lib/pdstack/recover-state.json")


def default_state() -> Path:
    return Path(os.environ.get("PDCTL_RECOVER_STATE", DEFAULT_STATE))


class RateLimited(PdctlError):
    exit_code = 4


@dataclass(frozen=True)
class RateLimit:
    max_count: int = 3
    window_s: float = 3600.0


class RecoveryLog:
    """Recovery start times per pair, in a JSON file that survives reboots of pdctl."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path, self.clock = path, clock

    def _load(self) -> dict[str, list[float]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: [float(t) for t in v] for k, v in data.items()} if isinstance(data, dict) else {}

    def recent(self, pair: str, window_s: float) -> list[float]:
        now = self.clock()
        return [t for t in self._load().get(pair, []) if now - t < window_s]

    def admit(self, pair: str, limit: RateLimit) -> None:
        """Record a recovery, or raise RateLimited when the pair had too many."""
        recent = self.recent(pair, limit.window_s)
        if len(recent) >= limit.max_count:
            raise RateLimited(
                f"{pair}: {len(recent)} recoveries in the last {limit.window_s:.0f}s (limit "
                f"{limit.max_count}); not restarting again. The failed unit stays failed for "
                f"the alert; fix the cause, then run: pdctl restart --both --pair {pair}"
            )
        data = self._load()
        data[pair] = [*recent, self.clock()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


def recover(
    ops: Ops, pair: Pair, limit: RateLimit, log: RecoveryLog, lock_path: Path | None = None
) -> Report:
    """The coordinated restart, once the rate limit and the restart lock allow it."""
    with lock.held(f"pdctl recover --pair {pair.id}", lock_path):
        log.admit(pair.id, limit)
        # The pair is already broken: a gateway we cannot reach must not block recovery.
        return restart_pair(ops, pair, drain_required=False)
