"""`pdctl rollout`: move groups to a new release in gated waves, and back by themselves.

A wave is K groups (--max-unavailable, in the roll's order: pdctl.ops.roll.order). Each
wave: the groups' release drop-ins are written (pdctl.ops.release), then they restart through
the one coordinated restart (pdctl.ops.restart.roll_held: the restart lock, drain, stop,
start, health, canary, verify, register; K at a time above the floor of all groups but K),
then they serve for `rollout.soak_s`, then the gate compares them with the groups still on
the release before over that window (pdctl.ops.gate). A failed gate or restart rolls the
wave's groups back to their release before through the same path and stops the rollout
(exit ROLLOUT_FAILED, one message naming the gate, the figures and the groups). The record
in etcd (pdctl.ops.rollout_state) says which waves are done and which release each group
runs, so `resume` on another machine carries on, and `undo` goes back wave by wave, the
last wave first.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial

from pdctl import exits, names
from pdctl.coord.kv import KV
from pdctl.errors import PdctlError
from pdctl.ops import gate, lock, release, restart, roll
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.release import Release
from pdctl.ops.report import Interrupted, Report
from pdctl.ops.rollout_state import (
    LIVE,
    Controller,
    GroupRelease,
    Record,
    RecordChanged,
    Records,
    Wave,
    controller,
    me,
)
from pdctl.ops.source import Pair
from pdctl.spec.profile import Rollout as Thresholds

WHAT = "pdctl rollout"
PAUSE_KEY = "rollouts/pause"
SOAK_POLL_S = 5.0  # how often a soaking wave looks for a pause


class RolloutFailed(PdctlError):
    exit_code = exits.ROLLOUT_FAILED


class NothingToDo(PdctlError):
    """Refused, nothing changed: nothing to resume, pause or undo, or nothing to roll."""


@dataclass(frozen=True)
class Settings:
    ttl_s: float  # the controller key's lease (etcd.lock_ttl_s)
    lock_wait: float = 0.0  # seconds each wave waits for the restart lock
    soak_poll_s: float = SOAK_POLL_S


Held = restart.Held
QueryFor = Callable[[str | None], gate.Query]  # the record's Prometheus URL -> a query


def waves(ops: Ops, chosen: list[Pair], k: int) -> list[list[str]]:
    """The groups in the roll's order (hosts in inventory order, each host's in a row), K a
    wave; the last wave may be smaller."""
    ids = [p.id for p in roll.order(chosen, ops.source.topology)]
    return [ids[n : n + k] for n in range(0, len(ids), k)]


def _pairs(ops: Ops, ids: list[str]) -> list[Pair]:
    by_id = {p.id: p for p in ops.source.pairs()}
    return [by_id[i] for i in ids]


def check_staged(ops: Ops, chosen: list[Pair], target: Release) -> None:
    """Every host of `chosen` has the target's environment (its pyvenv.cfg) and model
    revision (its config.json); else PdctlError naming each host, before anything changes."""
    hosts = list(dict.fromkeys(h for p in chosen for h in p.hosts))
    wanted = [f"{target.env}/pyvenv.cfg"]
    if target.model is not None:
        wanted.append(f"{target.model}/config.json")

    def missing(host: str) -> list[str]:
        sd = ops.systemd(host)
        return [f"{host} has no {w}" for w in wanted if sd.read_file(w) is None]

    gaps = [m for ms in concurrently({h: partial(missing, h) for h in hosts}).values() for m in ms]
    if gaps:
        raise PdctlError(
            f"unknown target {target.describe()}: {'; '.join(gaps)}; stage it first (site.yml); "
            "nothing was changed"
        )


def check_units_read_release(ops: Ops, chosen: list[Pair]) -> None:
    """Every engine unit of `chosen` reads its release drop-in (`${PDSTACK_ENV}` in its unit
    file); else PdctlError naming them, before anything changes. The units site.yml writes
    name their environment in ExecStart= itself (the host's venv), so a drop-in would
    change nothing and every gate would compare a release with itself."""
    members = [i for p in chosen for i in p.instances]

    def deaf(host: str) -> list[str]:
        sd = ops.systemd(host)
        texts = {
            i.unit: sd.read_file(f"{names.UNIT_DIR}/{i.unit}") for i in members if i.host == host
        }
        return [
            f"{host}:{u}"
            for u, text in texts.items()
            if text is not None and f"${{{release.ENV_VAR}}}" not in text
        ]

    hosts = list(dict.fromkeys(i.host for i in members))
    found = [u for us in concurrently({h: partial(deaf, h) for h in hosts}).values() for u in us]
    if found:
        raise PdctlError(
            f"{', '.join(found)} name their environment in ExecStart= (site.yml) and do not read "
            f"the release drop-in ({release.DROPIN}): pdctl rollout cannot switch them yet; "
            "nothing was changed"
        )


def refuse_live(rec: Record | None) -> None:
    if rec is not None and rec.state in LIVE:
        raise NothingToDo(
            f"rollout {rec.id} to {rec.target.describe()} is {rec.state} "
            f"({rec.waves_done()} of {len(rec.waves)} waves done): resume or undo it first "
            "(pdctl rollout status); nothing was changed"
        )


@dataclass(frozen=True)
class Request:
    """What `pdctl rollout start` asks for."""

    target: Release
    max_unavailable: str  # K, as --max-unavailable
    decode_first: bool
    prometheus: str | None
    thresholds: Thresholds  # the profile's rollout: section


def new_record(ops: Ops, chosen: list[Pair], req: Request) -> Record:
    """The record of a rollout of `chosen` to `target`: each group's release now, the waves
    of the groups not on `target` already; NothingToDo when every group is."""
    before = {p.id: release.of_group(ops, p) for p in chosen}
    moving = [p for p in chosen if before[p.id] != req.target]
    if not moving:
        raise NothingToDo(
            f"every chosen group runs {req.target.describe()} already; nothing to roll"
        )
    size = roll.max_unavailable(req.max_unavailable, len(ops.source.pairs()))
    now = time.time()
    return Record(
        id=f"r-{uuid.uuid4().hex[:8]}",
        target=req.target,
        state="running",
        waves=[Wave(groups=w) for w in waves(ops, moving, size)],
        groups={p.id: GroupRelease(before=before[p.id], now=before[p.id]) for p in moving},
        max_unavailable=req.max_unavailable,
        decode_first=req.decode_first,
        prometheus=req.prometheus,
        thresholds=req.thresholds,
        holder=me(),
        started=now,
        updated=now,
    )


def start(
    ops: Ops,
    store: KV,
    chosen: list[Pair],
    req: Request,
    s: Settings,
    query_for: QueryFor,
    held: Held,
) -> Record:
    """A new rollout, driven to its end (or its pause, or its failure). Its baseline (every
    moving group over the soak window before anything restarts) judges a wave that leaves
    no group on the release before."""
    with Controller(store, s.ttl_s) as ctl:
        records = Records(store)
        refuse_live(records.read())
        check_staged(ops, chosen, req.target)
        check_units_read_release(ops, chosen)
        rec = new_record(ops, chosen, req)
        query = query_for(req.prometheus)
        window = rec.thresholds.soak_s
        rec.baseline = gate.measure(query, list(rec.groups), window, False)[gate.OLD]
        _clear_pause(store)
        records.write(rec)
        ops.say(f"rollout {rec.id}: {len(rec.waves)} waves to {req.target.describe()}")
        return _drive(ops, records, rec, ctl, s, query, held)


def _clear_pause(store: KV) -> None:
    """An operator's pause request, gone (as it was read: one written since stays)."""
    entry = store.get(PAUSE_KEY)
    if entry is not None:
        store.delete_if_revision(PAUSE_KEY, entry.mod_revision)


def _restart(ops: Ops, rec: Record, ids: list[str], held: Held, verb: str) -> list[Report]:
    """The groups' coordinated restart as site.yml's roll does it (roll.of_k: one at a time,
    or K above the floor, groups left out of the gateways by an earlier failure first)."""
    b, include_drained = roll.of_k(rec.max_unavailable, len(ops.source.pairs()))
    chosen = restart.roll_order(ops, _pairs(ops, ids), b, include_drained)
    return restart.roll_held(ops, chosen, b, held, f"{WHAT} {verb} {rec.id}")


def _switch(
    ops: Ops, rec: Record, ids: list[str], to: Callable[[str], Release | None], held: Held
) -> list[Report]:
    """Write each group's release `to(id)` and restart the groups; the reports of those the
    roll began (a failure leaves the rest untouched: they still run what they ran)."""
    pairs = _pairs(ops, ids)
    for p in pairs:
        release.write(ops, p, to(p.id), rec.decode_first)
    try:
        reports = _restart(ops, rec, ids, held, "switch")
    except Interrupted:
        raise  # groups were restarting: their drop-ins stay as written (status shows them)
    except PdctlError:
        # Refused before any group stopped (the lock stayed held, the floor, etcd): the
        # drop-ins say again what runs, so that a recovery meanwhile starts no group on `to`.
        for p in pairs:
            release.write(ops, p, rec.groups[p.id].now, rec.decode_first)
        raise
    for r in reports:
        if r.ok or r.phases:  # restarted, or failed after its drain: it runs (or is out on) `to`
            rec.groups[r.target].now = to(r.target)
    return reports


def _failed(reports: list[Report]) -> str | None:
    bad = [r for r in reports if not r.ok]
    return None if not bad else "; ".join(f"{r.target}: {r.error}" for r in bad)


def _roll_back(ops: Ops, records: Records, rec: Record, wave: Wave, why: str, held: Held) -> None:
    """The wave's groups back to their release before (those the switch began, a group
    whose restart failed included: it comes back on the old release; the others never
    restarted), then the record says failed; RolloutFailed with `why`."""
    began = [g for g in wave.groups if rec.groups[g].now != rec.groups[g].before]
    for p in _pairs(ops, wave.groups):  # the drop-ins of all: untouched ones included
        release.write(ops, p, rec.groups[p.id].before, rec.decode_first)
    reports = _restart(ops, rec, began, held, "rollback") if began else []
    for r in reports:
        if r.ok:
            rec.groups[r.target].now = rec.groups[r.target].before
    back = _failed(reports)
    wave.state = "rolled back"
    rec.state = "failed"
    before = release.describe(rec.groups[wave.groups[0]].before)
    rec.message = (
        f"rollout {rec.id} stopped at wave {rec.waves.index(wave) + 1} of {len(rec.waves)} "
        f"({', '.join(wave.groups)}): {why}; "
        + (
            f"rolled back to {before}"
            if back is None
            else f"the rollback failed too ({back}): those groups stay out of the gateways"
        )
        + f"; waves done: {rec.waves_done()}"
    )
    records.write(rec)
    raise RolloutFailed(rec.message)


def _stopping(records: Records, rec: Record, ctl: Controller, store: KV) -> bool:
    """Whether to stop before the next step: an operator asked for a pause (the record says
    paused then), or the controller lost its key (RecordChanged)."""
    if ctl.lost is not None:
        raise RecordChanged(f"this controller lost its key in etcd ({ctl.lost}); stopping here")
    if store.get(PAUSE_KEY) is None:
        return False
    rec.state, rec.message = "paused", f"paused at wave {rec.waves_done() + 1}"
    records.write(rec)
    _clear_pause(store)
    return True


def _soak(ops: Ops, records: Records, rec: Record, ctl: Controller, s: Settings) -> bool:
    """Serve for soak_s; False when a pause came (the wave soaks again on resume)."""
    end = time.monotonic() + rec.thresholds.soak_s
    ops.say(f"rollout {rec.id}: soaking {rec.thresholds.soak_s:g}s")
    while (left := end - time.monotonic()) > 0:
        if _stopping(records, rec, ctl, records.store):
            return False
        time.sleep(min(left, s.soak_poll_s))
    return True


def _old_side(query: gate.Query, rec: Record) -> gate.Figures | None:
    """The groups still on the release before, over the window; None when none is left (the
    baseline, measured before the first wave, stands in)."""
    old = [g for g, r in rec.groups.items() if r.now == r.before]
    if not old:
        return rec.baseline
    return gate.measure(query, old, rec.thresholds.soak_s, False)[gate.OLD]


def _gate(query: gate.Query, rec: Record, wave: Wave) -> gate.Verdict:
    wave.new = gate.measure(query, wave.groups, rec.thresholds.soak_s, True)
    old = _old_side(query, rec)
    wave.old = old
    if old is None:
        wave.verdict = ["data: no old groups and no baseline to compare with"]
        return gate.Verdict(False, wave.verdict)
    verdict = gate.judge(wave.new, old, rec.thresholds)
    wave.verdict = verdict.failures
    return verdict


def _wave(ops: Ops, records: Records, rec: Record, wave: Wave, held: Held) -> None:
    """One wave: switch (unless soaking already, after a resume), soak, gate."""
    if wave.state in ("pending", "switching", "rolled back"):
        wave.state = "switching"
        records.write(rec)
        if failed := _failed(_switch(ops, rec, wave.groups, lambda _g: rec.target, held)):
            _roll_back(ops, records, rec, wave, f"restart failed: {failed}", held)
        wave.state = "soaking"
        records.write(rec)


def _drive(
    ops: Ops,
    records: Records,
    rec: Record,
    ctl: Controller,
    s: Settings,
    query: gate.Query,
    held: Held,
) -> Record:
    for n, wave in enumerate(rec.waves, 1):
        if wave.state == "passed":
            continue
        if _stopping(records, rec, ctl, records.store):
            return rec
        ops.say(f"rollout {rec.id}: wave {n} of {len(rec.waves)}: {', '.join(wave.groups)}")
        _wave(ops, records, rec, wave, held)
        if not _soak(ops, records, rec, ctl, s):
            return rec
        verdict = _gate(query, rec, wave)
        if not verdict.ok:
            _roll_back(ops, records, rec, wave, f"gate failed: {verdict.message()}", held)
        wave.state = "passed"
        records.write(rec)
        ops.say(f"rollout {rec.id}: wave {n} passed its gate")
    rec.state, rec.message = "done", None
    records.write(rec)
    return rec


def resume(ops: Ops, store: KV, s: Settings, query_for: QueryFor, held: Held) -> Record:
    """Carry on a paused or failed rollout, or one whose controller died, from its record:
    a rolled-back wave is switched again, a soaking one soaks again."""
    with Controller(store, s.ttl_s) as ctl:
        records = Records(store)
        rec = records.read()
        if rec is None or rec.state not in LIVE:
            state = "no rollout" if rec is None else f"rollout {rec.id} is {rec.state}"
            raise NothingToDo(f"nothing to resume: {state}; nothing was changed")
        _clear_pause(store)
        rec.state, rec.message = "running", None
        records.write(rec)
        ops.say(f"rollout {rec.id}: resumed at wave {rec.waves_done() + 1} of {len(rec.waves)}")
        return _drive(ops, records, rec, ctl, s, query_for(rec.prometheus), held)


def pause(store: KV) -> str:
    """Ask the controller to stop before its next step; a rollout without a live controller
    (it died) is marked paused at once. NothingToDo when none is running."""
    records = Records(store)
    rec = records.read()
    if rec is None or rec.state != "running":
        state = "no rollout" if rec is None else f"rollout {rec.id} is {rec.state}"
        raise NothingToDo(f"nothing to pause: {state}; nothing was changed")
    if controller(store) is None:
        rec.state, rec.message = "paused", "paused (its controller had died)"
        records.write(rec)
        return f"rollout {rec.id} paused (no controller was running it)"
    store.put_if_revision(PAUSE_KEY, me().encode(), 0)
    return f"rollout {rec.id}: its controller pauses before its next step"


def undo_order(rec: Record) -> list[list[str]]:
    """The groups to take back, wave by wave, the last wave first; only those whose release
    differs from the one before."""
    return [
        ids
        for w in reversed(rec.waves)
        if (ids := [g for g in w.groups if rec.groups[g].now != rec.groups[g].before])
    ]


def undo(ops: Ops, store: KV, s: Settings, held: Held) -> Record:
    """Every group of the rollout back to its release before, through the same restart."""
    with Controller(store, s.ttl_s):
        records = Records(store)
        rec = records.read()
        back = [] if rec is None or rec.state == "undone" else undo_order(rec)
        if rec is None or not back:
            state = "no rollout" if rec is None else f"rollout {rec.id} is {rec.state}"
            raise NothingToDo(
                f"nothing to undo: {state}, and no group runs another release than it ran "
                "before; nothing was changed"
            )
        rec.state, rec.message = "running", "undoing"
        records.write(rec)
        for ids in back:
            ops.say(f"rollout {rec.id}: undo {', '.join(ids)}")
            reports = _switch(ops, rec, ids, lambda g: rec.groups[g].before, held)
            if failed := _failed(reports):
                rec.state, rec.message = "failed", f"undo stopped: {failed}"
                records.write(rec)
                raise RolloutFailed(f"rollout {rec.id}: {rec.message}")
            for w in rec.waves:
                w.state = "pending" if set(w.groups) & set(ids) else w.state
            records.write(rec)
        rec.state, rec.message = "undone", None
        records.write(rec)
        return rec


def lock_held(ops: Ops, lock_wait: float) -> Held:
    """The restart lock each wave's restart takes: this host's, then the fleet's."""

    def held(what: str, targets: list[str]) -> AbstractContextManager[lock.Acquired]:
        return lock.held(
            what, None, lock_wait, ops.say, ops.timeouts.poll, ops.fleet_lock, targets=targets
        )

    return held
