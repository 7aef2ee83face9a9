"""`pdctl finish`: what a restarter that died left half-done, finished or undone.

A restart that died (killed, its host lost, its lock broken) leaves a phase record per pair
or group (pdctl.coord.restarts). pdstack-finish.timer runs this on every engine host, for
the pairs with a member there; under the fleet restart lock each abandoned record is:
- undone when its restart died draining: its engines never stopped, so once the pair's
  canaries pass it is registered again (a restart that was pending stays pending);
- finished otherwise: the coordinated restart as a recovery (nothing waits for requests:
  the pair is out of the gateways already), which brings it back from whatever step died.
A record of a pair the topology no longer has is cleared, with a line.
"""

from __future__ import annotations

from pdctl.coord import restarts
from pdctl.coord.kv import KV
from pdctl.errors import PdctlError
from pdctl.ops import lock
from pdctl.ops.context import Ops
from pdctl.ops.report import Report
from pdctl.ops.restart import outcome, restart_pair
from pdctl.ops.source import Pair

UNDO = ("canary", "verify", "register")


def _store(ops: Ops) -> KV:
    if ops.fleet_lock is None:
        raise PdctlError(
            "pdctl finish needs the fleet's etcd (the topology names no [etcd] member): "
            "restart records live there"
        )
    return ops.fleet_lock.store


def found(ops: Ops, host: str | None) -> list[restarts.Abandoned]:
    """The abandoned records of pairs with a member on `host` (None: any), and of pairs
    the topology does not have."""
    known = {p.id: p for p in ops.source.pairs()}
    return [
        a
        for a in restarts.abandoned(_store(ops))
        if a.record.target not in known or host is None or host in known[a.record.target].hosts
    ]


def _one(ops: Ops, pair: Pair, a: restarts.Abandoned, got: lock.Acquired) -> Report:
    undo = a.record.phase == "drain"
    ops.say(f"{pair.id}: {a.describe()}: {'undoing' if undo else 'finishing'} it")
    if undo:
        rep = restart_pair(
            ops, pair, planned=False, lock_lost=got.lost, phases=got.phases, only=UNDO
        )
        if rep.ok:
            return rep
        ops.say(f"{pair.id}: its engines fail their canary ({rep.error}); restarting it")
    return restart_pair(ops, pair, planned=False, lock_lost=got.lost, phases=got.phases)


def finish(ops: Ops, host: str | None, lock_wait: float) -> list[Report]:
    """Finish or undo every abandoned restart `found` (none: nothing is locked or done)."""
    todo = found(ops, host)
    if not todo:
        return []
    targets = [a.record.target for a in todo]
    what = f"pdctl finish {' '.join(targets)}"
    with lock.held(
        what, None, lock_wait, ops.say, ops.timeouts.poll, ops.fleet_lock, targets=targets
    ) as got:
        # Read again under the lock: a record is abandoned for sure now (no other holder).
        now = {a.record.target: a for a in found(ops, host)}
        pairs = {p.id: p for p in ops.source.pairs()}
        reports = []
        for target, a in now.items():
            if target in pairs:
                reports.append(_one(ops, pairs[target], a, got))
            elif restarts.clear(_store(ops), a):
                ops.say(f"{target}: {a.describe()}: not in the topology; its record is cleared")
        got.record(outcome(reports))
    return reports
