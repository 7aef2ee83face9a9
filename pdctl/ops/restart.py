"""The coordinated restart: the pair (or group) is the unit of restart.

drain (the gateway stops routing to the pair; in-flight requests finish, bounded) -> stop
every engine through the pair target -> start them -> wait for /health -> canary through the
pair's own PD path (a group's: through every prefill and every decode), then verify with
more -> re-register with the gateway. A pair that fails stays out of the gateway, so clients
never meet it; rolling restarts stop at the first failed pair.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial

from pdctl.coord import gateways as liveness
from pdctl.coord.history import Outcome
from pdctl.coord.kv import StoreUnavailable
from pdctl.coord.restarts import Phases
from pdctl.errors import PdctlError
from pdctl.ops import gateway, pending, roll
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.lock import Acquired
from pdctl.ops.report import PHASES as PHASES  # re-exported: restart.PHASES
from pdctl.ops.report import Interrupted, Report, StepFailed
from pdctl.ops.source import Pair
from pdctl.ops.systemd import Systemd
from pdctl.roles import Role
from pdctl.topology import TopologyInstance

JOURNAL_LINES = 30
PROGRESS_EVERY_S = 5.0
# The health wait asks the engines' /ready this often (a flag check each: SGLang's
# http_server.ready), and their units' state every `Timeouts.poll`: the pair goes on to its
# canary within this of being ready.
READY_POLL_S = 0.1


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        phases[name] = round(time.monotonic() - t0, 3)


def plan_lines(ops: Ops, pairs: list[Pair], budget: roll.Budget = roll.ONE) -> list[str]:
    t = ops.timeouts
    gw = ", ".join(g.url for g in ops.gateways)
    each = "each gateway" if len(ops.gateways) > 1 else "the gateway"
    out: list[str] = []
    for n, p in enumerate(pairs, 1):
        one_leg = len(p.instances) == 2  # a pair: 1P1D, one PD path
        members = "both" if one_leg else "all"
        paths = "this group's PD path" if one_leg else "every prefill and decode"
        # Across hosts each host's stop returns once its own members are down.
        down = "" if len(p.hosts) > 1 else f" (returns once {members} engines are down)"
        out += [
            f"{n}. group {p.id} ({p.spec.target}): {' + '.join(i.url for i in p.instances)}",
            f"   drain     remove {members} from {each} ({gw}), wait <= {t.drain:.0f}s for "
            "in-flight requests",
            *(
                f"   stop      systemctl stop {p.spec.target} {' '.join(i.unit for i in p.on(h))}"
                f" on {h}{down}"
                for h in p.hosts
            ),
            f"   start     systemctl start {p.spec.target}"
            + (f" on {', '.join(p.hosts)} (once every member is down)" if len(p.hosts) > 1 else ""),
            f"   health    wait <= {t.health:.0f}s for /health on {members}",
            f"   canary    a request through {paths} (retried until it passes)",
            f"   verify    {ops.verify_canaries} more{'' if one_leg else ' each'}; "
            "every one must pass",
            f"   register  add {members} back to {each}, bound to each other (pairing "
            f"protocol {p.id}), wait until it routes to them",
        ]
    if len(pairs) > 1:
        out.append(roll.plan_line(budget))
    return out


def _journal(sd: Systemd, units: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for unit in units:
        try:
            out[unit] = sd.journal(unit, JOURNAL_LINES)
        except PdctlError as e:
            out[unit] = [f"(journal unavailable: {e})"]
    return out


def _pair_journal(ops: Ops, pair: Pair) -> dict[str, list[str]]:
    """Each member's journal from its own host; a group across hosts keys them HOST/UNIT."""
    out: dict[str, list[str]] = {}
    for host in pair.hosts:
        journal = _journal(ops.systemd(host), [i.unit for i in pair.on(host)])
        out |= journal if len(pair.hosts) == 1 else {f"{host}/{u}": j for u, j in journal.items()}
    return out


def _instance_line(ops: Ops, sd: Systemd, inst: TopologyInstance, failure: str | None) -> str:
    try:
        st = sd.show(inst.unit)
        state = f"{st.active}/{st.sub}, PID {st.main_pid or '-'}"
    except PdctlError as e:
        state = f"state unknown ({e})"
    probe = ops.engines.probe(inst.url)
    ok = failure is None and probe.healthy
    why = "" if failure is None else f"; {failure}"
    return (
        f"{'OK' if ok else 'FAILED'}: {inst.id} ({inst.unit}) {state}, "
        f"{probe.ready_path} {probe.health}{why}"
    )


def _wait_healthy(ops: Ops, pair: Pair) -> None:
    """Until every member takes work: the probe reads /ready (not starting, not paused), or
    /health on an SGLang without it (health.readiness). A unit that failed or stopped while
    starting ends the wait."""
    deadline = time.monotonic() + ops.timeouts.health
    t0 = last = time.monotonic()
    units_seen = -math.inf  # at the first miss, then every poll
    while True:
        probes = concurrently({i.name: partial(ops.engines.ready, i.url) for i in pair.instances})
        if all(p.healthy for p in probes.values()):
            return
        now = time.monotonic()
        if now - units_seen >= ops.timeouts.poll:
            units_seen = now
            _check_started(ops, pair)
        if now >= deadline:
            waiting = ", ".join(f"{k} {p.health}" for k, p in probes.items() if not p.healthy)
            raise StepFailed("health", f"not healthy after {ops.timeouts.health:.0f}s: {waiting}")
        if now - last >= PROGRESS_EVERY_S:
            last = now
            states = ", ".join(f"{k} {p.health}" for k, p in probes.items())
            ops.say(f"  {pair.id}: waiting for health: {states} [{now - t0:.0f}s]")
        time.sleep(min(READY_POLL_S, ops.timeouts.poll))


def _check_started(ops: Ops, pair: Pair) -> None:
    for inst in pair.instances:
        st = ops.systemd(inst.host).show(inst.unit)
        if st.active in ("failed", "inactive"):
            raise StepFailed("health", f"{inst.unit} is {st.active} ({st.sub}) while starting")


def _first_canary(ops: Ops, pair: Pair) -> None:
    """Per leg (a group's: every prefill and decode on one at least), retry single requests
    until one passes (the first one pays the KV-path cold start)."""
    deadline = time.monotonic() + ops.timeouts.canary
    for prefill, decode in pair.legs():
        port = prefill.bootstrap_port or 0
        while True:
            left = max(deadline - time.monotonic(), 1.0)
            first = ops.canaries.pair(prefill.url, decode.url, port, 1, min(left, 30.0))
            if first.ok:
                break
            if time.monotonic() >= deadline:
                raise StepFailed(
                    "canary",
                    f"no request passed {_leg(pair, prefill, decode)}in "
                    f"{ops.timeouts.canary:.0f}s: {first.error}",
                )
            time.sleep(ops.timeouts.poll)


def _verify(ops: Ops, pair: Pair) -> None:
    """`verify_canaries` requests per leg must all pass: a degraded pair fails only a share.
    Sent at once, not one after another: each is a request of its own down the pair's PD
    path (its own bootstrap room), and a degraded pair fails a share of them in any order;
    the step then takes one request's time, which a recovery's time to serving again pays."""
    legs = pair.canary_legs()
    sent = concurrently(
        {n: partial(ops.canaries.group, legs, 1) for n in range(ops.verify_canaries)}
    ).values()
    if failed := sum(r.failed for r in sent):
        error = next(r.error for r in sent if r.error)
        total = sum(r.sent for r in sent)
        raise StepFailed("verify", f"{failed}/{total} requests failed: {error}")


def _leg(pair: Pair, prefill: TopologyInstance, decode: TopologyInstance) -> str:
    """`from P to D ` in a group's messages; a pair's have one leg and say nothing."""
    return "" if len(pair.instances) == 2 else f"from {prefill.name} to {decode.name} "


def registrations(pairs: list[Pair]) -> list[gateway.Registration]:
    """Both workers of each pair, bound to each other by the pair's id as pairing protocol:
    smg then never combines them with another pair's worker, whatever its round robin
    rotations say (docs/gateway.md, "Groups stay groups")."""
    return [
        gateway.Registration(
            i.url,
            i.role.value,
            i.bootstrap_port if i.role is Role.PREFILL else None,
            pairing=p.id,
            running_window=i.max_running_requests,
        )
        for p in pairs
        for i in p.instances
    ]


# A gateway whose host holds no liveness key gets one connection attempt this short: a
# powered-off host then costs a restart this once, not the admin API's connect timeout (5 s)
# at each of its steps. The kernel answers a connection however loaded the gateway process
# is, so half a second is ample within a fleet's network; every recovery with a host lost
# pays it once.
GONE_CONNECT_S = 0.5


class Reach:
    """The gateways one pair's restart (or a recovery's containment) contacts.

    Before the first contact the gateways' liveness keys are read once (pdctl.coord.gateways,
    one range read). A gateway whose host holds no key and that takes no connection within
    GONE_CONNECT_S is gone (its host lost or powered off, or its gateway stopped): it is named
    once and not contacted again in this restart. One that stops answering later is gone as
    well once its key has expired. A gateway whose host holds its key blocks the restart when
    it does not answer (it may still serve clients), and so does every one without a store or
    while etcd cannot tell. Each pair's restart reads the keys afresh: in a roll, a gateway
    that came back is drained like the others."""

    def __init__(self, ops: Ops, pair: Pair) -> None:
        self.ops, self.pair = ops, pair
        self.gone: set[str] | None = None  # URLs; None: the keys are not read yet
        topo = ops.source.topology.gateways
        self.host = {gw.url: g.host for g, gw in zip(topo, ops.gateways, strict=True)}

    def gateways(self) -> list[gateway.Gateway]:
        """Every gateway but those gone."""
        if self.gone is None:
            self.each(_no_call)
        assert self.gone is not None
        return [gw for gw in self.ops.gateways if gw.url not in self.gone]

    def each(self, call: Callable[[gateway.Gateway], None]) -> None:
        """`call` at every gateway but those gone, all at once. At the first contact a
        gateway whose host holds no key is first given GONE_CONNECT_S to take a connection,
        in its own thread, so that the others' calls do not wait for it; one that takes none
        is gone and not called."""
        keyless = self._first_contact()

        def there(gw: gateway.Gateway) -> bool:
            if gw.url in keyless and not self._takes_connection(gw):
                return False
            call(gw)
            return True

        assert self.gone is not None
        gws = [gw for gw in self.ops.gateways if gw.url not in self.gone]
        called = concurrently({gw.url: partial(there, gw) for gw in gws})
        self._forget([u for u, ok in called.items() if not ok])

    def _first_contact(self) -> set[str]:
        """The gateways (URLs) to try briefly first: those whose host holds no key, at the
        first contact; none after it."""
        if self.gone is not None:
            return set()
        self.gone = set()
        return self._keyless()

    def _takes_connection(self, gw: gateway.Gateway) -> bool:
        if not gw.reachable(GONE_CONNECT_S):
            return False
        self.ops.say(
            f"  {self.pair.id}: WARNING: gateway {gw.url} answers, but its host holds no key "
            f"in etcd: is pdstack-gateway-lease running on {self.host[gw.url]}?"
        )
        return True

    def silent(self, urls: list[str]) -> list[str]:
        """Of `urls` (gateways that took no connection), those gone now; remembered."""
        keyless = self._keyless() if urls else set()
        gone = [u for u in urls if u in keyless]
        self._forget(gone)
        return gone

    def _keyless(self) -> set[str]:
        """The gateways (URLs) whose host holds no key; none without a store, or when etcd
        cannot tell."""
        if self.ops.store is None:
            return set()
        try:
            keys = liveness.alive(self.ops.store)
        except PdctlError:
            return set()
        return {url for url, host in self.host.items() if host not in keys}

    def _forget(self, urls: list[str]) -> None:
        assert self.gone is not None
        for url in urls:
            if url in self.gone:
                continue
            self.gone.add(url)
            self.ops.say(
                f"  {self.pair.id}: WARNING: gateway {url} is gone (no key of its host in etcd: "
                f"{self.host[url]} is lost or its gateway stopped, and it takes no connection); "
                "going on without it for this restart (it registers every group when it comes "
                "back)"
            )


def _no_call(_: gateway.Gateway) -> None:
    return None


def _reachable(reach: Reach, phase: str, required: bool) -> list[gateway.Gateway]:
    """The gateways that answer, of those not gone. Required: every one must, or StepFailed
    names those that do not (before anything changes); else the others are skipped with a
    line saying so (a gateway that comes back registers every pair itself, ExecStartPost=)."""

    silent: list[str] = []

    def answers(gw: gateway.Gateway) -> str | None:
        try:
            gw.workers()
            return None
        except gateway.GatewayUnreachable as e:
            silent.append(gw.url)
            return str(e)
        except gateway.GatewayError as e:
            return str(e)

    errors = concurrently({gw.url: partial(answers, gw) for gw in reach.gateways()})
    gone = reach.silent(silent)
    down = [e for u, e in errors.items() if e is not None and u not in gone]
    if down and required:
        stopped = "; nothing was stopped" if phase == "drain" else ""
        raise StepFailed(phase, "; ".join(down) + stopped)
    for e in down:
        reach.ops.say(f"  {reach.pair.id}: cannot {phase} ({e}); going on")
    return [gw for gw in reach.gateways() if errors[gw.url] is None]


def register_pair(ops: Ops, pair: Pair, required: bool = True, reach: Reach | None = None) -> None:
    """Add both engines to every gateway (but those `reach` found gone), bound to each
    other, and wait until each routes to them."""
    t = ops.timeouts.register

    def register(gw: gateway.Gateway) -> None:
        try:
            _register_at(gw, pair, t)
        except gateway.GatewayUnreachable as e:
            raise WentAway(
                "register",
                f"{e}: it went away during the register; the group is left for pdctl finish "
                "(it registers the group at every gateway that answers; a gateway that starts "
                "registers every group itself)",
            ) from None

    gws = _reachable(reach or Reach(ops, pair), "register", required)
    concurrently({gw.url: partial(register, gw) for gw in gws})


# The register step reads each gateway's /workers this often while it waits (for the drained
# entries to go, then for the new ones to be ready): the pair serves again within this of
# the gateway adding it.
REGISTER_POLL_S = 0.05


def _register_at(gw: gateway.Gateway, pair: Pair, t: float) -> None:
    urls = [i.url for i in pair.instances]
    # smg answers 409 while the drained entries are still being removed.
    if not gw.wait(gateway.settled(urls, pair.id), t, REGISTER_POLL_S):
        raise StepFailed(
            "register", f"gateway {gw.url} still lists the drained workers after {t:.0f}s"
        )
    gw.register(registrations([pair]))
    if not gw.wait(gateway.ready(urls), t, REGISTER_POLL_S):
        raise StepFailed("register", f"gateway {gw.url} did not mark both ready within {t:.0f}s")


class WentAway(StepFailed):
    """A gateway stopped taking connections in the middle of the step."""


@dataclass
class GatewayRegistration:
    """What `pdctl gateway register` did at one gateway."""

    host: str
    url: str
    workers: dict[str, str] = field(default_factory=dict)  # URL -> Gateway.register's word
    error: str | None = None  # the gateway did not answer in time


def register_gateways(
    ops: Ops, hosts: tuple[str, ...], timeout: float
) -> list[GatewayRegistration]:
    """Register every pair, bound, with the gateways on `hosts` (default: all), each waited
    for up to `timeout` s to answer (it may be starting), and remove the workers they hold
    that are no instance of the topology (pairs removed from the profile). The gateway unit
    runs this after each start: smg starts empty, so no worker is ever held unbound."""
    topo = ops.source.topology
    chosen = [topo.gateway(h) for h in hosts] if hosts else topo.gateways
    admins = {g.host: gw for g, gw in zip(topo.gateways, ops.gateways, strict=True)}
    regs = registrations(ops.source.pairs())

    def one(host: str, url: str) -> GatewayRegistration:
        out = GatewayRegistration(host, url)
        try:
            admins[host].wait_answering(timeout)
            out.workers = admins[host].register(regs, prune=True)
        except gateway.GatewayError as e:
            out.error = str(e)
        return out

    done = concurrently({g.host: partial(one, g.host, g.url) for g in chosen})
    return list(done.values())


def _drain(ops: Ops, pair: Pair, planned: bool, reach: Reach) -> None:
    """Take the pair out of every gateway. A planned restart waits (bounded) for the requests
    in flight; a recovery does not: one side is dead, and what the live side holds depends
    on it (a room its dead decode never claimed waits on a 0.5.23 prefill until the
    bootstrap timeout, 300 s, and on 0.5.17 for ever: docs/sim.md)."""
    if not planned:
        drop(ops, pair, reach)
        return
    urls = [i.url for i in pair.instances]
    deadline = time.monotonic() + ops.timeouts.drain
    try:
        # Every gateway must answer before any stops routing: a gateway left out would keep
        # sending requests to engines about to stop.
        gws = _reachable(reach, "drain", required=True)
        concurrently({gw.url: partial(gw.remove, urls) for gw in gws})
        waited = concurrently(
            {gw.url: partial(gw.wait, gateway.drained(urls), ops.timeouts.drain) for gw in gws}
        )
    except gateway.GatewayError as e:
        raise StepFailed("drain", f"{e}; nothing was stopped") from None
    # smg's `load` stays 0 for streamed requests, so the gateways' word is not enough: the
    # engines' own count, within what is left of the same window.
    left = deadline - time.monotonic()
    busy = {} if not all(waited.values()) else _wait_idle(ops, urls, left)
    if not all(waited.values()) or busy:
        held = f" ({', '.join(f'{u}: {n}' for u, n in busy.items())})" if busy else ""
        ops.say(
            f"  {pair.id}: requests still in flight after {ops.timeouts.drain:.0f}s{held}; "
            "stopping anyway (SIGTERM lets engines finish them within TimeoutStopSec)"
        )


def drop(ops: Ops, pair: Pair, reach: Reach) -> None:
    """A recovery's drain (and a waiting recovery's containment): the pair out of every
    gateway that answers, each on its own (none waits for another to answer first, nor for a
    lost host's connection attempt: Reach.each), then the live side's requests ended
    (abort_held). A gateway that does not answer is named and skipped."""
    urls, silent = [i.url for i in pair.instances], []

    def out_of(gw: gateway.Gateway) -> None:
        try:
            gw.remove(urls)
        except gateway.GatewayError as e:
            if isinstance(e, gateway.GatewayUnreachable):
                silent.append(gw.url)
            ops.say(f"  {pair.id}: cannot drain ({e}); going on")

    reach.each(out_of)
    reach.silent(silent)
    abort_held(ops, pair, urls)


def abort_held(ops: Ops, pair: Pair, urls: list[str]) -> None:
    """A recovery ends what the live side holds (it depends on the dead side) before the
    stop: an engine's graceful stop would wait for it, up to its TimeoutStopSec."""
    answered = concurrently({u: partial(ops.engines.abort_all, u) for u in urls})
    if aborted := [u for u, ok in answered.items() if ok]:
        ops.say(f"  {pair.id}: ended the requests held by {', '.join(aborted)}")


def _wait_idle(ops: Ops, urls: list[str], timeout: float) -> dict[str, int]:
    """Poll the engines until none holds a request; what each still holds on timeout. An
    engine that does not answer holds nothing it could finish."""
    deadline = time.monotonic() + timeout
    while True:
        counts = concurrently({u: partial(ops.engines.in_flight, u) for u in urls})
        busy = {u: n for u, n in counts.items() if n}
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(ops.timeouts.poll)


def on_each_host(ops: Ops, pair: Pair, step: Callable[[Systemd, str, list[str]], None]) -> None:
    """`step` with each host's systemd, the pair's target and its units there, on all its
    hosts at once (a group across hosts has a target on each; the first failure raises)."""
    concurrently(
        {
            h: partial(step, ops.systemd(h), pair.spec.target, [i.unit for i in pair.on(h)])
            for h in pair.hosts
        }
    )


def stop_pair(ops: Ops, pair: Pair) -> None:
    """Stop every engine of the pair or group, on each of its hosts, and wait until all are
    down (before any starts: a new decode beside an old prefill is the failure below)."""
    on_each_host(ops, pair, _stop_here)


def _stop_here(sd: Systemd, target: str, units: list[str]) -> None:
    """Stop the pair's (or group's) target on `sd`'s host and wait until its engines there
    (`units`) are down.

    The engine units are named beside the target: systemctl waits only for the jobs of the
    units it is given, and a target is ordered After= the units it Wants=, so on a stop its
    own job is done first, while PartOf= has only queued the engines' stops. With the target
    alone, systemctl returns while an engine is still in its graceful SIGTERM shutdown (it
    finishes in-flight requests, up to TimeoutStopSec): the next start then brings the new
    decode up beside the old prefill, whose bootstrap server still answers. The first request
    that reaches the new decode then (any pair canary: `pdctl status` or `doctor`, the
    pd-exporter) registers its KV with the old prefill; the decode caches that per bootstrap
    address (SGLang does) and never registers again with the new prefill, which is back within
    the decode's heartbeat window, so every transfer fails ("KV transfer failed") until both
    restart again."""
    sd.stop(target, *units)


def _start_here(sd: Systemd, target: str, units: list[str]) -> None:
    sd.reset_failed(*units)  # a crashed side starts clean
    sd.start(target)


def _clear_pending(ops: Ops, pair: Pair) -> None:
    """The pair runs its current files now: no restart is pending any more, on any of its
    hosts."""
    for host in pair.hosts:
        try:
            pending.clear(ops.systemd(host), pair)
        except PdctlError as e:
            ops.say(f"  {pair.id}: restarted, but its restart-pending marker stays: {e}")


def _no_reason() -> str | None:
    return None


def _any_phase(_: str) -> None:
    return None


class LockLost(StepFailed):
    """The fleet restart lock is no longer this restart's: stop before the next step."""


def restart_pair(
    ops: Ops,
    pair: Pair,
    planned: bool = True,
    lock_lost: Callable[[], str | None] = _no_reason,
    on_phase: Callable[[str], None] = _any_phase,
    phases: Phases | None = None,
    only: Collection[str] = PHASES,
) -> Report:
    """The pair's steps in order (those in `only`: an undone restart's canary, verify and
    register); before each one `lock_lost` (the fencing check of the fleet
    restart lock) must give no reason, or the restart stops there and says why. `on_phase`
    hears each step's name as it begins (a roll names them on Ctrl-C); `phases` records it in
    etcd, conditional on the lock (a failed write stops the restart as a lost lock does), and
    drops the record once the restart has ended and said how (done, or a step after the
    drain failed: the pair stays out for the operator, as its report says). A restart that
    dies, is interrupted, loses the lock, fails its drain or meets a gateway that went away
    mid-register leaves its record: pdctl.ops.finish takes it up.

    Planned (an operator's restart or roll): every gateway that is not gone must answer the
    drain and the register, and the drain waits for requests in flight. Not planned (a
    recovery: a side crashed): gateways that do not answer are skipped, and nothing waits
    for requests, which depend on the dead side."""
    units = [i.unit for i in pair.instances]
    rep = Report(pair.id)
    reach = Reach(ops, pair)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("drain", lambda: _drain(ops, pair, planned, reach)),
        ("stop", lambda: stop_pair(ops, pair)),
        ("start", lambda: on_each_host(ops, pair, _start_here)),
        ("health", lambda: _wait_healthy(ops, pair)),
        ("canary", lambda: _first_canary(ops, pair)),
        ("verify", lambda: _verify(ops, pair)),
        ("register", lambda: register_pair(ops, pair, planned, reach)),
    ]
    steps = [s for s in steps if s[0] in only]
    ops.say(f"{pair.id}: restarting {' + '.join(units)}")
    phase = steps[0][0]
    try:
        for phase, step in steps:
            on_phase(phase)
            lost = lock_lost()
            if lost is None and phases is not None:
                lost = _recorded(phases, pair, phase)
            if lost is not None:
                raise LockLost(
                    phase,
                    f"stopped before it: this restart no longer holds the fleet restart lock "
                    f"({lost}); another restarter may be working on the fleet",
                )
            with _timed(rep.phases, phase):
                step()
    except PdctlError as e:
        rep.ok, rep.error = False, str(e)
        rep.journal = _pair_journal(ops, pair)
        # Left for pdctl finish: a drain that failed left the pair out of the gateways that
        # answered, its engines untouched (it registers them again); a gateway that went away
        # mid-register, the pair ready but not at every gateway; a lost lock, for the
        # restarter that holds it now.
        drained = isinstance(e, StepFailed) and e.phase == "drain"
        if not (drained or isinstance(e, WentAway)):
            rep.error += " (the group stays out of the gateway)"
        unfinished = drained or isinstance(e, (LockLost, WentAway))
    except KeyboardInterrupt:
        raise Interrupted(pair.id, phase, recorded=phases is not None) from None
    else:
        unfinished = False
    rep.phase = phase
    if phases is not None and not unfinished:
        _ended(ops, phases, pair)
    if rep.ok:
        _clear_pending(ops, pair)
    rep.lines = [
        _instance_line(ops, ops.systemd(i.host), i, None if rep.ok else rep.error)
        for i in pair.instances
    ]
    return rep


def _recorded(phases: Phases, pair: Pair, phase: str) -> str | None:
    """Why the pair's phase could not be recorded under the fleet lock (the restart stops
    before the step, as when the lock is lost), or None."""
    try:
        if phases.enter(pair.id, phase):
            return None
    except StoreUnavailable as e:
        return f"etcd cannot record its phase: {e}"
    return "etcd refused to record its phase: the lock is under another lease"


def _ended(ops: Ops, phases: Phases, pair: Pair) -> None:
    """The pair's restart ended and its report says how (which endings skip this and leave
    the record for pdctl finish is restart_pair's `unfinished`): its phase record is deleted,
    only while this restarter's lease still holds the fleet lock (`Phases.done`; under
    another lease nothing is deleted). When etcd cannot serve, the record stays: once the
    lock is free, pdctl finish takes the pair up again from the recorded phase."""
    try:
        phases.done(pair.id)
    except StoreUnavailable as e:
        ops.say(
            f"  {pair.id}: its restart record stays in etcd ({e}); pdctl finish takes the group "
            "up again from its last phase"
        )


def restart_pairs(
    ops: Ops,
    pairs: list[Pair],
    lock_lost: Callable[[], str | None] = _no_reason,
    budget: roll.Budget = roll.ONE,
    phases: Phases | None = None,
) -> list[Report]:
    """Roll `pairs` through restart_pair: one at a time by default, at most `budget.max_out`
    at once above a capacity floor with a bounded budget (pdctl.ops.roll). After a failure
    the pairs not started are left alone, and so they are once `lock_lost` gives a reason
    (the fleet restart lock is another's now)."""
    return roll.run(ops, pairs, restart_pair, budget, lock_lost, phases)


def roll_order(
    ops: Ops, chosen: list[Pair], budget: roll.Budget, include_drained: bool
) -> list[Pair]:
    """The groups in the order they roll: as chosen, or with a capacity floor in the roll's
    order after its checks against the gateways' view (roll.prepare: PdctlError before
    anything stops)."""
    if budget.min_serving is None:
        return chosen
    return roll.prepare(ops, chosen, budget.min_serving, include_drained)


# The restart lock for a command line (what the history and a refused restarter show) and
# its targets: `pdctl restart`'s, or `pdctl roll`'s own host lock file.
Held = Callable[[str, list[str]], AbstractContextManager[Acquired]]


def roll_held(
    ops: Ops, chosen: list[Pair], budget: roll.Budget, held: Held, what: str
) -> list[Report]:
    """Roll `chosen` (restart_pairs) under the restart lock `held` gives for `what` and the
    groups' ids, and record what it did in the fleet's history."""
    ids = [p.id for p in chosen]
    with held(f"{what} {' '.join(ids)}", ids) as got:
        reports = restart_pairs(ops, chosen, got.lost, budget, got.phases)
        got.record(outcome(reports))
    return reports


def outcome(reports: list[Report]) -> Outcome:
    """What a restart did, for the fleet's restart history."""
    failed = [r for r in reports if not r.ok]
    return Outcome(
        result="failed" if failed else "ok",
        error=f"{failed[0].target}: {failed[0].error}" if failed else None,
        targets=[r.target for r in reports],
        phases={r.target: r.phases for r in reports},
    )


def _until(ops: Ops, ok: Callable[[], bool], timeout: float, failure: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() >= deadline:
            raise StepFailed("health", f"{failure} after {timeout:.0f}s")
        time.sleep(ops.timeouts.poll)


def _gateway_ready(gw: gateway.Gateway) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return gw.readiness()[0]
        except gateway.GatewayError:
            return False  # restarting: not listening yet

    return ready


def restart_gateways(ops: Ops) -> list[Report]:
    """Every gateway, one at a time (the others keep serving); the first failure stops."""
    reports: list[Report] = []
    for r, gw in zip(ops.source.topology.gateways, ops.gateways, strict=True):
        sd = ops.systemd(r.host)
        rep = Report(f"{r.host}/{r.unit}")
        try:
            with _timed(rep.phases, "restart"):
                sd.restart(r.unit)
            with _timed(rep.phases, "health"):
                _until(ops, _gateway_ready(gw), ops.timeouts.register, "gateway not ready")
        except PdctlError as e:
            rep.ok, rep.error = False, str(e)
            rep.journal = _journal(sd, [r.unit])
        rep.lines = [
            f"{'OK' if rep.ok else 'FAILED'}: {r.host}/gateway ({r.unit})"
            + ("" if rep.ok else f": {rep.error}")
        ]
        reports.append(rep)
        if not rep.ok:
            break
    return reports


def restart_instance(ops: Ops, inst: TopologyInstance) -> Report:
    """One side alone (--force): leaves the pair degraded on NIXL; says so."""
    sd = ops.systemd(inst.host)
    rep = Report(inst.id)
    try:
        with _timed(rep.phases, "restart"):
            sd.restart(inst.unit)
        with _timed(rep.phases, "health"):
            _until(
                ops, lambda: ops.engines.probe(inst.url).healthy, ops.timeouts.health, "not healthy"
            )
    except PdctlError as e:
        rep.ok, rep.error = False, str(e)
        rep.journal = _journal(sd, [inst.unit])
    rep.lines = [_instance_line(ops, sd, inst, rep.error)]
    return rep
