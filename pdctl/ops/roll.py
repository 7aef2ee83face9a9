"""Rolls of many groups: at most K out of the gateways at once, above a capacity floor.

`pdctl restart --both --all --max-unavailable K [--min-serving N]`: every group goes through
restart_pair's steps unchanged, all under the one fleet restart lock the restart holds; at
most K groups are between their drain and their register at any moment, fleet-wide, and a
group is never split. Before each new group is drained, the gateways' own view (the groups
every answering gateway routes to) must keep at least N serving once it is out too; else the
roll waits for one of its own groups to come back, or, with none out, up to the floor
timeout, then stops. The first failure stops new groups from starting; those restarting
finish (or fail) and are reported; the rest are left untouched and listed.

Without --max-unavailable and --min-serving (`ONE`) the roll is the one pdctl always did: one
group at a time, in the calling thread, no floor check.
"""

from __future__ import annotations

import heapq
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from pdctl.coord.restarts import Phases
from pdctl.errors import PdctlError
from pdctl.ops import gateway
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.report import Interrupted, Report
from pdctl.ops.source import Pair
from pdctl.topology import Topology

PROGRESS_EVERY_S = 10.0
_COUNT = re.compile(r"(-?\d+)(%?)")


@dataclass(frozen=True)
class Budget:
    max_out: int = 1  # K: groups out of the gateways at once
    min_serving: int | None = None  # the floor; None: none checked (the plain roll)


ONE = Budget()


def max_unavailable(text: str, groups: int) -> int:
    """K from `--max-unavailable`: a count, or a percentage of the fleet's `groups` rounded
    down and at least 1 (as Ansible's `serial: 25%`)."""
    m = _COUNT.fullmatch(text.strip())
    if m is None:
        raise PdctlError(
            f"--max-unavailable {text!r}: give a count of groups (2) or a percentage of the "
            f"fleet's {groups} groups (25%)"
        )
    n, percent = int(m[1]), bool(m[2])
    if n <= 0:
        raise PdctlError(
            f"--max-unavailable {text}: at least one group must be let out at a time "
            "(1 or more, or a percentage above 0%)"
        )
    if percent and n > 100:
        raise PdctlError(f"--max-unavailable {text}: a percentage is at most 100%")
    if percent:
        return max(1, n * groups // 100)
    if n > groups:
        raise PdctlError(f"--max-unavailable {n} is more than the fleet's {groups} groups")
    return n


def budget(k: str | None, min_serving: int | None, groups: int) -> Budget:
    """The roll's budget from the options; ONE when neither is given. The floor defaults to
    all groups but K; one K makes impossible is refused, naming both."""
    if k is None and min_serving is None:
        return ONE
    out = max_unavailable(k, groups) if k is not None else 1
    floor = groups - out if min_serving is None else min_serving
    if floor >= groups:
        raise PdctlError(
            f"--min-serving {floor}: the fleet has {groups} groups, so none could ever be "
            "taken out; lower --min-serving"
        )
    if floor > groups - out:
        k_is = f"{k} ({out} groups)" if k is not None and k.strip().endswith("%") else out
        raise PdctlError(
            f"--max-unavailable {k_is} and --min-serving {floor} cannot both hold: with {out} "
            f"of the fleet's {groups} groups out, {groups - out} serve; lower one of them"
        )
    return Budget(out, floor)


def of_k(k: str, groups: int) -> tuple[Budget, bool]:
    """The budget of a roll given K alone (site.yml's roll, a rollout's waves), and whether
    chosen groups out of the gateways already restart (first): "1" rolls one at a time with
    no floor, as always; K above the floor of all groups but K, taking up a group an earlier
    failure left out."""
    if k.strip() == "1":
        return ONE, False
    return budget(k, None, groups), True


def plan_line(b: Budget) -> str:
    if b.min_serving is None:
        return (
            "Groups restart one at a time; the others keep serving. "
            "The first failure stops the roll."
        )
    return (
        f"Groups restart at most {b.max_out} at a time (one host's in a row, hosts in inventory "
        f"order), each only while the gateways still route to at least {b.min_serving} groups "
        "once it is out. The first failure stops new groups from starting."
    )


def serving(ops: Ops, pairs: list[Pair]) -> set[str] | None:
    """The ids of the groups that every gateway that answers routes to (each member listed
    ready and healthy: what register waits for); None when no gateway answered."""

    def listing(gw: gateway.Gateway) -> list[gateway.GatewayWorker] | None:
        try:
            return gw.workers()
        except gateway.GatewayError:
            return None

    got = concurrently({gw.url: partial(listing, gw) for gw in ops.gateways})
    views = [ws for ws in got.values() if ws is not None]
    if not views:
        return None
    ready = {p.id: gateway.ready(i.url for i in p.instances) for p in pairs}
    return {pid for pid, routed in ready.items() if all(routed(ws) for ws in views)}


def left_serving(now: set[str], out: set[str], candidate: str) -> int:
    """Groups the gateways still route to once `candidate` is out too. `out` (this roll's
    groups out now) are not counted even where a gateway lists them again already."""
    return len(now - out - {candidate})


def order(pairs: list[Pair], topo: Topology, first: Collection[str] = ()) -> list[Pair]:
    """Hosts in inventory order, each host's groups in a row (one host's GPUs loading at a
    time keeps PCIe and disk contention predictable); `first` (groups out of the gateways
    already) before them: restarting those costs no capacity and brings some back."""
    hosts = list(dict.fromkeys(i.host for i in topo.instances))
    return sorted(pairs, key=lambda p: (p.id not in first, hosts.index(p.hosts[0])))


def prepare(ops: Ops, chosen: list[Pair], floor: int, include_drained: bool) -> list[Pair]:
    """The roll's order, after the checks that need the gateways' view; PdctlError (exit 2)
    before anything stops: a chosen group out of the gateways already (unless
    `include_drained`), or a `floor` the first group would break now."""
    everything = ops.source.pairs()
    now = serving(ops, everything)
    if now is None:
        raise PdctlError(
            "no gateway answered, so the capacity floor cannot be checked; nothing was stopped "
            "(pdctl status shows the gateways)"
        )
    out = [p.id for p in chosen if p.id not in now]
    if out and not include_drained:
        raise PdctlError(
            f"out of the gateways already: {', '.join(out)} (an interrupted or failed "
            "restart? pdctl status shows it); --include-drained restarts it first, or leave it "
            "out of --pair"
        )
    ordered = order(chosen, ops.source.topology, set(out))
    left = left_serving(now, set(), ordered[0].id)
    if left < floor:
        raise PdctlError(_short(now, len(everything), ordered[0].id, left, floor))
    return ordered


def _short(now: set[str], groups: int, candidate: str, left: int, floor: int) -> str:
    return (
        f"the gateways route to {len(now)} of {groups} groups; taking {candidate} out would "
        f"leave {left}, below --min-serving {floor}"
    )


def lanes(b: Budget, groups: int, down: int = 0) -> int:
    """Groups the roll can have out at once: K, fewer when `down` groups of the fleet's
    `groups` are out of the gateways for another reason and the floor leaves less room,
    min(K, N - D - floor); at least 1 (the floor is waited for, not given up on)."""
    if b.min_serving is None:
        return b.max_out
    return max(1, min(b.max_out, groups - down - b.min_serving))


def finish(busy: Iterable[float], waiting: Iterable[float], k: int) -> float:
    """When the last group ends, the roll's scheduler played forward: the groups out end
    after their `busy` seconds left, and each waiting group, in order, starts on the first of
    `k` lanes to come free. From a cold start, N groups of T seconds end after ceil(N/K) T:
    whole waves, not N T / K."""
    free = sorted(busy)
    free += [0.0] * max(k - len(free), 0)
    heapq.heapify(free)
    end = max(free, default=0.0)
    for t in waiting:
        start = heapq.heappop(free)
        heapq.heappush(free, start + t)
        end = max(end, start + t)
    return end


def time_left(done_s: list[float], running_s: list[float], left: int, k: int) -> float | None:
    """Seconds until the roll ends, from the measured phase times of the groups done: each
    group not started takes their mean, each one out the mean less what it has run, over `k`
    lanes (`finish`). None before a group is done."""
    if not done_s:
        return None
    mean = sum(done_s) / len(done_s)
    return finish([max(mean - e, 0.0) for e in running_s], [mean] * left, k)


def _duration(s: float) -> str:
    m, sec = divmod(round(s), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


class Step(Protocol):
    """restart_pair, or a stand-in in tests."""

    def __call__(
        self,
        ops: Ops,
        pair: Pair,
        *,
        lock_lost: Callable[[], str | None],
        on_phase: Callable[[str], None],
        phases: Phases | None,
    ) -> Report: ...


@dataclass
class _Out:
    pair: Pair
    started: float
    phase: str = "drain"


class _Roll:
    """The scheduler: the calling thread starts groups (each in a thread of its own when K
    > 1) and reaps their reports. What the threads share is guarded: ops.say and the fencing
    check through locks, the reports through a queue; gateway clients hold no state."""

    def __init__(
        self,
        ops: Ops,
        pairs: list[Pair],
        step: Step,
        b: Budget,
        lock_lost: Callable[[], str | None],
        phases: Phases | None,
    ) -> None:
        self.say_lock, self.fence_lock = threading.Lock(), threading.Lock()
        self.raw_say, self.lock_lost, self.phases = ops.say, lock_lost, phases
        self.ops = replace(ops, say=self.say)
        self.step, self.budget = step, b
        self.everything = ops.source.pairs()
        self.pending = deque(pairs)
        self.total = len(pairs)
        self.out: dict[str, _Out] = {}
        self.reports: list[Report] = []
        self.done_s: list[float] = []
        self.finished: queue.Queue[tuple[str, Report | BaseException]] = queue.Queue()
        self.halted = False
        self.interrupted = threading.Event()
        self.down = 0  # groups out of the gateways, not this roll's: fewer lanes (`lanes`)

    def say(self, line: str) -> None:
        with self.say_lock:
            self.raw_say(line)

    def fence(self) -> str | None:
        if self.interrupted.is_set():  # Ctrl-C reached the roll: stop before the next step
            raise KeyboardInterrupt
        with self.fence_lock:
            return self.lock_lost()

    def run(self) -> list[Report]:
        try:
            while True:
                startable = self.pending and not self.halted
                if startable and len(self.out) < self.budget.max_out and self._room():
                    self._start(self.pending.popleft())
                    continue
                if not self.out:
                    break
                self._reap(*self.finished.get())
        except KeyboardInterrupt:
            raise self._interrupted() from None
        if self.halted and self.pending:
            self.say(f"stopping the roll; untouched: {', '.join(p.id for p in self.pending)}")
        return self.reports

    def _room(self) -> bool:
        """May the next group go out? With groups of this roll out, a no waits for one of
        them to end; with none, the floor is waited for up to its timeout, then the roll
        stops with a report saying why the group was not started."""
        floor = self.budget.min_serving
        if floor is None:
            return True
        pair, timeout = self.pending[0], self.ops.timeouts.floor
        t0 = last = time.monotonic()
        while True:
            now = serving(self.ops, self.everything)
            if now is None:
                why = "no gateway answered"
            else:
                self.down = len(self.everything) - len(now | set(self.out))
                left = left_serving(now, set(self.out), pair.id)
                if left >= floor:
                    return True
                why = _short(now - set(self.out), len(self.everything), pair.id, left, floor)
            if self.out:
                self.say(f"roll: holding {pair.id} back: {why}; waiting for a group to return")
                return False
            elapsed = time.monotonic() - t0
            if elapsed >= timeout:
                self.halted = True
                self.reports.append(
                    Report(pair.id, ok=False, error=f"not started: {why} after {timeout:.0f}s")
                )
                return False
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                self.say(f"roll: waiting to take {pair.id} out: {why} [{elapsed:.0f}s]")
            time.sleep(self.ops.timeouts.poll)

    def _start(self, pair: Pair) -> None:
        out = self.out[pair.id] = _Out(pair, time.monotonic())
        self._progress()
        if self.budget.max_out == 1:
            self._work(out)  # in this thread: Ctrl-C interrupts its step as it always did
        else:
            threading.Thread(
                target=self._work, args=(out,), name=f"restart {pair.id}", daemon=True
            ).start()

    def _work(self, out: _Out) -> None:
        def on_phase(phase: str) -> None:
            out.phase = phase

        try:
            got: Report | BaseException = self.step(
                self.ops, out.pair, lock_lost=self.fence, on_phase=on_phase, phases=self.phases
            )
        except BaseException as e:  # Interrupted, or a bug: the scheduler raises it
            got = e
        self.finished.put((out.pair.id, got))

    def _reap(self, pid: str, got: Report | BaseException) -> None:
        if isinstance(got, BaseException):
            if isinstance(got, Interrupted):
                raise self._interrupted()
            raise got
        self.out.pop(pid)
        self.reports.append(got)
        if got.ok:
            self.done_s.append(sum(got.phases.values()))
        else:
            self.halted = True
        self._progress()

    def _interrupted(self) -> PdctlError:
        """Every group this roll leaves out of the gateways: those out now (at their phase),
        then those that failed after their drain (a failed group stays out)."""
        self.interrupted.set()
        out = [(o.pair.id, o.phase) for o in self.out.values()]
        out += [(r.target, list(r.phases)[-1]) for r in self.reports if not r.ok and r.phases]
        out = [(p, ph) for p, ph in out if ph != "drain" or p in self.out]
        if not out:
            e = PdctlError("interrupted before any group was taken out of the gateways")
            e.exit_code = Interrupted.exit_code
            return e
        in_flight = self.phases is not None and bool(self.out)
        return Interrupted(*out[0], *out[1:], recorded=in_flight)

    def _progress(self) -> None:
        if self.total < 2:
            return
        now = time.monotonic()
        eta = time_left(
            self.done_s,
            [now - o.started for o in self.out.values()],
            len(self.pending),
            lanes(self.budget, len(self.everything), self.down),
        )
        ended = not self.out and not self.pending
        self.say(
            f"roll: out {', '.join(self.out) or 'none'}; done {len(self.reports)} of "
            f"{self.total}; left {len(self.pending)}"
            + ("" if eta is None or ended else f"; about {_duration(eta)} to go")
        )


def run(
    ops: Ops,
    pairs: list[Pair],
    step: Step,
    b: Budget,
    lock_lost: Callable[[], str | None],
    phases: Phases | None = None,
) -> list[Report]:
    """Roll `pairs` (in this order) through `step`; the reports in the order groups ended."""
    return _Roll(ops, pairs, step, b, lock_lost, phases).run()
