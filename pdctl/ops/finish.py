"""`pdctl finish`: what a restarter that died left half-done, taken up where it stopped.

A restart that died (killed, its host lost, its lock lost) leaves a phase record per pair or
group (pdctl.coord.restarts). pdstack-finish.timer runs this on every engine host, for the
pairs with a member there; under the fleet restart lock each abandoned record is taken up
where its phase says the engines are:
- died draining: undone. Its engines never stopped, so once the pair's canaries pass it is
  registered again (a restart that was pending stays pending);
- died at the health wait or later: resumed. The new engines were started: their health,
  canaries, register;
- died stopping or starting: finished with the whole coordinated restart, as a recovery
  (nothing waits for requests: the pair is out of the gateways already).
A resume whose step fails falls back to the whole restart. A record of a pair the topology
no longer has is cleared, with a line.
"""

from __future__ import annotations

from pdctl.coord import restarts
from pdctl.coord.kv import KV
from pdctl.errors import PdctlError
from pdctl.ops import lock
from pdctl.ops.context import Ops
from pdctl.ops.report import PHASES, Report
from pdctl.ops.restart import outcome, restart_pair
from pdctl.ops.source import Pair


def resume_steps(phase: str) -> tuple[str, ...]:
    """The steps that bring back a pair whose restart died in `phase` (module docstring)."""
    if phase == "drain":
        return PHASES[PHASES.index("canary") :]
    if phase in PHASES[PHASES.index("health") :]:
        return PHASES[PHASES.index("health") :]
    return PHASES


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
    steps = resume_steps(a.record.phase)
    ops.say(f"{pair.id}: {a.describe()}: taking it up at {steps[0]}")
    rep = restart_pair(ops, pair, planned=False, lock_lost=got.lost, phases=got.phases, only=steps)
    if rep.ok or steps == PHASES:
        return rep
    ops.say(f"{pair.id}: {rep.error}; restarting it whole")
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
