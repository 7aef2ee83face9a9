"""site.yml's config-change roll (`pdctl roll`): one call, a plan in and a result out, both JSON.

roles/pdstack_engine/tasks/roll.yml hands in the play's changed groups that run, the roll's
budget (pdstack_engine_roll_max_unavailable) and lock wait, and, when the groups are on
several hosts, the ssh settings it built from the inventory: pdctl then runs on the
controller. The groups take the path of `pdctl restart --both --pair ... --yes` (ops.restart:
the restart lock, then per group drain, stop, start, health, canary, verify, register; K at
a time above the floor, pdctl.ops.roll), and the result says how each group ended and the
play's failure message, so the role never reads pdctl's progress lines.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from pdctl import exits
from pdctl.coord.lock import RestartLock
from pdctl.errors import PdctlError
from pdctl.ops import lock, restart, roll
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.report import Interrupted, Report
from pdctl.ops.source import Pair

# What the history and a refused restarter show for this roll (then the groups' ids).
WHAT = "pdctl roll"
# Seconds the controller gives each engine to take a connection before the roll.
CONNECT_S = 5.0


class Plan(BaseModel):
    """What site.yml hands in."""

    model_config = ConfigDict(extra="forbid")

    groups: list[str] = Field(min_length=1)  # ids: HOST/NAME, or NAME across hosts
    max_unavailable: str = "1"  # as `pdctl restart --max-unavailable`; "1": no floor
    lock_wait: float = Field(default=0.0, ge=0)  # seconds, as --lock-wait
    # An `ssh -F` file's text: pdctl runs on the controller and reaches the hosts with it.
    ssh_config: str | None = None


Outcome = Literal["restarted", "failed", "not started", "interrupted", "untouched"]


class GroupError(BaseModel):
    phase: str | None  # the step it failed in; None: the roll stopped before it began
    message: str


class GroupResult(BaseModel):
    id: str
    outcome: Outcome
    phase: str | None = None  # the last step it began
    phases: dict[str, float] = {}  # seconds per step
    error: GroupError | None = None
    journal: dict[str, list[str]] = {}  # unit -> its last lines, for a failed group


class Result(BaseModel):
    ok: bool
    exit: int  # pdctl's exit code (pdctl.exits)
    error: str | None = None  # why the roll stopped before or beside its groups
    message: str | None = None  # the play's failure message; None when ok
    groups: list[GroupResult]


class Unreachable(PdctlError):
    """The controller cannot reach a host or an engine of the roll: refused before anything
    stops (a group whose host or engine it cannot reach would fail after its drain)."""


def budget(plan: Plan, groups: int) -> tuple[roll.Budget, bool]:
    """The roll's budget over the fleet's `groups` (roll.of_k)."""
    return roll.of_k(plan.max_unavailable, groups)


def check_reach(ops: Ops, chosen: list[Pair]) -> None:
    """From the controller, before anything stops: every host of the roll as root (ssh, one
    systemctl), and every engine's port (the engine firewall lets the controller through)."""
    hosts = list(dict.fromkeys(h for p in chosen for h in p.hosts))
    errors = concurrently({h: partial(_host_error, ops, h, chosen) for h in hosts})
    engines = [i for p in chosen for i in p.instances]
    errors |= concurrently({i.id: partial(_engine_error, i.url) for i in engines})
    found = [e for e in errors.values() if e is not None]
    if found:
        raise Unreachable("; ".join(found) + "; nothing was stopped")


def _host_error(ops: Ops, host: str, chosen: list[Pair]) -> str | None:
    target = next(p.spec.target for p in chosen if host in p.hosts)
    try:
        ops.systemd(host).show(target)
    except PdctlError as e:
        return f"the controller cannot reach {host} as root over ssh ({e})"
    return None


def _engine_error(url: str) -> str | None:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=CONNECT_S).close()
    except OSError as e:
        return (
            f"the controller cannot reach {url} ({e}): the roll of several hosts runs pdctl "
            "on the controller; let it through the engine firewall "
            "(pdstack_engine_firewall_allow: [CONTROLLER_ADDRESS])"
        )
    return None


def run(ops: Ops, plan: Plan, fleet: RestartLock | None, lock_path: Path | None = None) -> Result:
    """The roll of `plan` under the restart lock (`lock_path`: the host lock's file, default
    pdctl.ops.lock's; `fleet`: the fleet lock in etcd, None for the host lock only)."""
    ids = plan.groups
    try:
        chosen = ops.source.select(tuple(plan.groups), False)
        ids = [p.id for p in chosen]
        if plan.ssh_config is not None:
            check_reach(ops, chosen)
        b, include_drained = budget(plan, len(ops.source.pairs()))
        chosen = restart.roll_order(ops, chosen, b, include_drained)
        for line in restart.plan_lines(ops, chosen, b):
            ops.say(line)

        def held(what: str, targets: list[str]) -> AbstractContextManager[lock.Acquired]:
            return lock.held(
                what, lock_path, plan.lock_wait, ops.say, ops.timeouts.poll, fleet, targets=targets
            )

        reports = restart.roll_held(ops, chosen, b, held, WHAT)
    except Interrupted as e:
        return result(ids, [], e, dict(e.out))
    except PdctlError as e:
        return result(ids, [], e)
    return result(ids, reports)


def refused(ids: list[str], error: PdctlError) -> Result:
    """The result of a roll that could not begin (bad plan, no topology, no store)."""
    return result(ids, [], error)


def result(
    ids: list[str],
    reports: list[Report],
    error: PdctlError | None = None,
    interrupted: dict[str, str] | None = None,
) -> Result:
    """The result in the plan's order; groups without a report were left untouched."""
    by_id = {r.target: r for r in reports}
    groups = [
        _interrupted(i, interrupted[i])
        if interrupted and i in interrupted
        else _group(by_id[i])
        if i in by_id
        else GroupResult(id=i, outcome="untouched")
        for i in ids
    ]
    failed = [g for g in groups if g.error is not None]
    code = error.exit_code if error else exits.FAILED if failed else exits.OK
    out = Result(
        ok=code == exits.OK, exit=code, error=None if error is None else str(error), groups=groups
    )
    out.message = None if out.ok else message(out)
    return out


def _group(r: Report) -> GroupResult:
    if r.ok:
        return GroupResult(id=r.target, outcome="restarted", phase=r.phase, phases=r.phases)
    return GroupResult(
        id=r.target,
        outcome="failed" if r.phases else "not started",
        phase=r.phase,
        phases=r.phases,
        error=GroupError(phase=r.phase, message=r.error or "failed"),
        journal=r.journal,
    )


def _interrupted(gid: str, phase: str) -> GroupResult:
    return GroupResult(
        id=gid,
        outcome="interrupted",
        phase=phase,
        error=GroupError(phase=phase, message=f"interrupted during {phase}"),
    )


def _ids(groups: Iterable[GroupResult], outcome: Outcome) -> list[str]:
    return [g.id for g in groups if g.outcome == outcome]


def message(result: Result) -> str:
    """The play's failure message: why the roll stopped, each group that failed and how, and
    the groups restarted and untouched; then where to look."""
    parts = [result.error] if result.error else []
    parts += [f"{g.id}: {g.error.message}" for g in result.groups if g.error is not None]
    parts = [p.rstrip(".") for p in parts]
    for outcome in ("restarted", "untouched"):
        if ids := _ids(result.groups, outcome):
            parts.append(f"{outcome}: {', '.join(ids)}")
    failed = any(g.outcome in ("failed", "interrupted") for g in result.groups)
    after = (
        "A failed group stays out of the gateways and the groups after it were not restarted"
        if failed
        else "Nothing was stopped"
        if not _ids(result.groups, "restarted")
        else "The groups not restarted keep running on their old files"
    )
    return f"pdctl roll failed (exit {result.exit}): {'; '.join(parts)}. {after}: pdctl status."
