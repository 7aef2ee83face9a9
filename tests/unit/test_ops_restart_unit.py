"""pdctl.ops.restart over fakes (pdctl/ops/context.py's seams): the plan, the steps and
what a failure leaves, the drain, registration with every gateway, the gateways' restart,
Ctrl-C. tests/integration/test_ops_restart.py runs it against real engines and smg."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import cast

import pytest

from pdctl.coord.kv import StoreUnavailable
from pdctl.coord.restarts import Phases
from pdctl.errors import PdctlError
from pdctl.ops import finish, gateway, restart
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.health import EngineProbe, Leg
from pdctl.pdclient import CANARIES_VERIFY, CanaryResult
from tests.unit.ops_fakes import (
    FakeCanaries,
    FakeEngines,
    FakeGateway,
    FakeSystemd,
    Listing,
    Unreachable,
    fake_ops,
)


def test_plan_lines_name_every_step() -> None:
    ops = fake_ops(FakeSystemd(), FakeGateway())
    text = "\n".join(restart.plan_lines(ops, ops.source.pairs()))
    assert "1. group node-a/pd0 (pdstack-pd0.target): http://10.0.0.1:30000 + " in text
    assert (
        "systemctl stop pdstack-pd1.target pdstack-pd1-prefill.service "
        "pdstack-pd1-decode.service on node-a (returns once both engines are down)"
    ) in text
    assert "verify    5 more; every one must pass" in text
    assert "Groups restart one at a time" in text


def test_a_unit_failing_to_start_stops_the_roll() -> None:
    sd, gw = FakeSystemd(fail_start={"pdstack-pd0-decode.service"}), FakeGateway()
    down = FakeEngines(lambda url: EngineProbe(url, "unreachable (ConnectionError)"))
    ops = fake_ops(sd, gw, engines=down)
    reports = restart.restart_pairs(ops, ops.source.pairs())
    assert len(reports) == 1 and not reports[0].ok
    assert "pdstack-pd0-decode.service is failed" in (reports[0].error or "")
    assert "stays out of the gateway" in (reports[0].error or "")
    assert reports[0].journal["pdstack-pd0-decode.service"] == [
        "pdstack-pd0-decode.service: RuntimeError: CUDA out of memory"
    ]
    assert [line.split(":")[0] for line in reports[0].lines] == ["FAILED", "FAILED"]
    assert ("stop", PD0_STOP) in sd.jobs
    assert not any("pd1" in " ".join(u) for _, u in sd.jobs)  # pd1 untouched
    assert not any(c.startswith("add") for c in gw.calls)  # never re-registered


# systemctl waits only for the jobs of the units it names, and a target's own stop job ends
# before the stops PartOf= queued for its engines: the stop names them, so it returns once
# both are down, and the start never brings a new engine up beside an old one still stopping.
PD0_STOP = ("pdstack-pd0.target", "pdstack-pd0-prefill.service", "pdstack-pd0-decode.service")


def test_the_stop_waits_for_both_engines_not_only_the_target() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert rep.ok, rep.error
    assert [j for j in sd.jobs if j[0] in ("stop", "start")] == [
        ("stop", PD0_STOP),
        ("start", ("pdstack-pd0.target",)),
    ]


LOST = "its lease expired and pdf2 PID 7 pdctl restart --all, since 12:00:00 holds the lock now"


def test_a_roll_stops_before_its_next_pair_once_the_fleet_lock_is_lost() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    reasons = iter([None] * len(restart.PHASES) + [LOST])  # asked before each step
    reports = restart.restart_pairs(ops, ops.source.pairs(), lambda: next(reasons))
    assert [r.ok for r in reports] == [True, False]
    assert reports[1].error == (
        f"drain: stopped before it: this restart no longer holds the fleet restart lock ({LOST}); "
        "another restarter may be working on the fleet"
    )
    assert not any("pd1" in " ".join(u) for _, u in sd.jobs)  # pd1 untouched
    assert not any("pd1" in c for c in gw.calls)


def test_a_restart_that_loses_the_fleet_lock_mid_pair_stops_before_its_next_step() -> None:
    """Paused past the ttl between stop and start: it never starts the pair another holder
    may be restarting now, and says the group stays out of the gateway."""
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    reasons = iter([None, None, LOST])  # drain, stop, then lost before start
    rep = restart.restart_pair(ops, ops.source.pairs()[0], lock_lost=lambda: next(reasons))
    assert not rep.ok and (rep.error or "").startswith("start: stopped before it: this restart")
    assert "(the group stays out of the gateway)" in (rep.error or "")
    assert [v for v, _ in sd.jobs] == ["stop"]
    assert list(rep.phases) == ["drain", "stop"]


def test_a_failing_canary_keeps_the_pair_out() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    failing = FakeCanaries(lambda _n: CanaryResult(False, 1, 1, None, "decode answered HTTP 500"))
    ops = fake_ops(sd, gw, canaries=failing)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[:1])
    assert not rep.ok and rep.error is not None
    assert rep.error.startswith("canary: no request passed in 0s: decode answered HTTP 500")
    assert gw.calls == ["remove http://10.0.0.1:30000", "remove http://10.0.0.1:30001"]


def test_a_successful_restart_reregisters_both() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    ops = fake_ops(sd, gw)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[1:])
    assert rep.ok and list(rep.phases) == list(restart.PHASES)
    # Bound to each other: smg combines a prefill only with decodes of its pairing protocol.
    pair_id = ops.source.pairs()[1].id
    assert sorted(gw.calls[-2:]) == [
        f"add http://10.0.0.1:30010 pairing {pair_id}",
        f"add http://10.0.0.1:30011 pairing {pair_id}",
    ]
    assert [j for j, _ in sd.jobs] == ["stop", "reset-failed", "start"]


def test_restart_drains_and_registers_at_every_gateway() -> None:
    sd, gws = FakeSystemd(), [FakeGateway("http://gw1:8000"), FakeGateway("http://gw2:8000")]
    ops = fake_ops(sd, *gws)
    pair = ops.source.pairs()[0]
    (rep,) = restart.restart_pairs(ops, [pair])
    assert rep.ok, rep.error
    for gw in gws:
        assert sorted(gw.calls) == [
            f"add http://10.0.0.1:30000 pairing {pair.id}",
            f"add http://10.0.0.1:30001 pairing {pair.id}",
            "remove http://10.0.0.1:30000",
            "remove http://10.0.0.1:30001",
        ]
    assert "remove both from each gateway (http://gw1:8000, http://gw2:8000)" in "\n".join(
        restart.plan_lines(ops, [pair])
    )


def _restart_with_engine_counts(
    counts: dict[str, list[int | None]], drain: float, planned: bool = True
) -> tuple[FakeSystemd, list[str], list[str]]:
    """Restart pd0 (planned, or as a recovery) while its engines report `counts` in turn (the
    last repeats); the systemd jobs, what was said, and each poll's URL."""
    sd, said, polls = FakeSystemd(), [], []

    def in_flight(url: str) -> int | None:
        assert sd.jobs == [], "an engine was polled after the stop"
        polls.append(url)
        left = counts.get(url, [0])
        return left.pop(0) if len(left) > 1 else left[0]

    ops = fake_ops(sd, FakeGateway(), engines=FakeEngines(held=in_flight))
    ops.say, ops.timeouts = said.append, replace(ops.timeouts, drain=drain)
    rep = restart.restart_pair(ops, ops.source.pairs()[0], planned)
    assert rep.ok, rep.error
    return sd, said, polls


def test_the_drain_waits_for_the_engines_own_in_flight_count() -> None:
    """smg's `load` stays 0 for streamed requests: the stop waits until both engines say 0."""
    decode = "http://10.0.0.1:30001"
    sd, said, polls = _restart_with_engine_counts({decode: [2, 1, 0]}, drain=30)
    assert polls.count(decode) == 3
    assert sd.jobs[0][0] == "stop"
    assert not [line for line in said if "still in flight" in line]


def test_a_drain_that_times_out_names_the_busy_engine_and_stops_anyway() -> None:
    decode, prefill = "http://10.0.0.1:30001", "http://10.0.0.1:30000"
    sd, said, _ = _restart_with_engine_counts({decode: [3], prefill: [None]}, drain=0.1)
    (line,) = [line for line in said if "still in flight" in line]
    assert f"({decode}: 3)" in line and prefill not in line  # unanswered: nothing to wait for
    assert sd.jobs[0][0] == "stop"


def test_a_recovery_takes_the_pair_out_and_stops_without_waiting_for_requests() -> None:
    """What the live side holds depends on the crashed one and can never finish: a recovery
    drains the gateways and stops at once, however long the drain timeout."""
    decode = "http://10.0.0.1:30001"
    t0 = time.monotonic()
    sd, said, polls = _restart_with_engine_counts({decode: [5]}, drain=600, planned=False)
    assert time.monotonic() - t0 < 5
    assert polls == [] and sd.jobs[0][0] == "stop"
    assert not [line for line in said if "still in flight" in line]


class _StopAfterAbort(FakeSystemd):
    def __init__(self, engines: FakeEngines) -> None:
        super().__init__()
        self.engines, self.aborted_before_stop = engines, list[str]()

    def stop(self, *units: str) -> None:
        self.aborted_before_stop = list(self.engines.aborted)
        super().stop(*units)


@pytest.mark.parametrize("planned", [True, False])
def test_a_recovery_ends_what_the_live_side_holds_before_its_stop(planned: bool) -> None:
    """Its graceful stop would wait for requests that depend on the dead side: a recovery
    ends them first (SGLang's /pause_generation, mode abort); a planned restart never does."""
    engines = FakeEngines()
    sd = _StopAfterAbort(engines)
    ops = fake_ops(sd, FakeGateway(), engines=engines)
    pair = ops.source.pairs()[0]
    rep = restart.restart_pair(ops, pair, planned)
    assert rep.ok, rep.error
    urls = sorted(i.url for i in pair.instances)
    assert sorted(sd.aborted_before_stop) == ([] if planned else urls)


def test_an_unreachable_gateway_during_drain_stops_nothing() -> None:
    sd, up, down = FakeSystemd(), FakeGateway("http://gw1:8000"), Unreachable("http://gw2:8000")
    ops = fake_ops(sd, up, down)
    (rep,) = restart.restart_pairs(ops, ops.source.pairs())
    assert not rep.ok and rep.error is not None
    assert rep.error.startswith("drain: gateway http://gw2:8000: ConnectionError: refused")
    assert rep.error.endswith("nothing was stopped")
    assert sd.jobs == [] and up.calls == []  # not even the reachable gateway drained it


def test_recovery_skips_an_unreachable_gateway() -> None:
    """A broken pair is restarted even when a gateway is down; that gateway registers every
    pair itself when it starts again."""
    sd, up, down = FakeSystemd(), FakeGateway("http://gw1:8000"), Unreachable("http://gw2:8000")
    said: list[str] = []
    ops = fake_ops(sd, up, down)
    ops.say = said.append
    rep = restart.restart_pair(ops, ops.source.pairs()[0], planned=False)
    assert rep.ok, rep.error
    assert sum(c.startswith("add") for c in up.calls) == 2
    assert any("cannot drain (gateway http://gw2:8000" in line for line in said)
    assert any("cannot register (gateway http://gw2:8000" in line for line in said)


PD0_PREFILL = GatewayWorker("a", "http://10.0.0.1:30000", "prefill", "ready", True, 0, "node-a/pd0")


def test_register_adds_what_a_gateway_lacks_and_leaves_the_rest() -> None:
    held = Listing(
        "http://gw1:8000",
        [
            PD0_PREFILL,
            GatewayWorker("b", "http://10.0.0.1:30001", "decode", "ready", True, 0, None),
            GatewayWorker("c", "http://10.0.0.1:30010", "prefill", "draining", True, 1, None),
        ],
    )
    fresh = FakeGateway("http://gw2:8000")
    ops = fake_ops(FakeSystemd(), held, fresh)
    done = restart.register_gateways(ops, (), timeout=1)
    assert [(d.host, d.error) for d in done] == [("node-a", None), ("router-2", None)]
    assert done[0].workers == {
        "http://10.0.0.1:30000": "bound",
        "http://10.0.0.1:30001": "unbound (pairing none)",
        "http://10.0.0.1:30010": "draining",
        "http://10.0.0.1:30011": "added",
    }
    assert held.calls == ["add http://10.0.0.1:30011 pairing node-a/pd1"]
    assert set(done[1].workers.values()) == {"added"}
    assert sorted(fresh.calls) == [
        "add http://10.0.0.1:30000 pairing node-a/pd0",
        "add http://10.0.0.1:30001 pairing node-a/pd0",
        "add http://10.0.0.1:30010 pairing node-a/pd1",
        "add http://10.0.0.1:30011 pairing node-a/pd1",
    ]
    (only,) = restart.register_gateways(ops, ("router-2",), timeout=1)
    assert only.url == "http://gw2:8000"
    with pytest.raises(PdctlError, match="no gateway on 'gw9'; gateways run on: node-a, router-2"):
        restart.register_gateways(ops, ("gw9",), timeout=1)


def test_register_removes_workers_of_pairs_that_left_the_topology() -> None:
    gw = Listing(
        "http://gw1:8000",
        [
            PD0_PREFILL,
            GatewayWorker("x", "http://10.0.0.9:30020", "prefill", "ready", True, 0, "pd2"),
            GatewayWorker("y", "http://10.0.0.9:30021", "decode", "draining", True, 0, "pd2"),
        ],
    )
    ops = fake_ops(FakeSystemd(), gw)
    (done,) = restart.register_gateways(ops, (), timeout=1)
    assert done.workers["http://10.0.0.9:30020"] == "removed"
    assert "http://10.0.0.9:30021" not in done.workers  # being drained: smg removes it
    assert gw.calls[0] == "remove http://10.0.0.9:30020"
    assert sorted(gw.calls[1:]) == [
        "add http://10.0.0.1:30001 pairing node-a/pd0",
        "add http://10.0.0.1:30010 pairing node-a/pd1",
        "add http://10.0.0.1:30011 pairing node-a/pd1",
    ]
    # Re-registering one pair after its restart never removes the others.
    gw.calls.clear()
    restart.register_pair(ops, ops.source.pairs()[1])
    assert not any(c.startswith("remove") for c in gw.calls)


def test_register_waits_bounded_for_a_gateway_that_does_not_answer() -> None:
    ops = fake_ops(FakeSystemd(), Unreachable("http://gw1:8000"))
    (d,) = restart.register_gateways(ops, (), timeout=0.3)
    assert d.workers == {} and d.error is not None
    assert d.error == "gateway http://gw1:8000: ConnectionError: refused (still, after 0s)"


def test_a_degraded_pair_fails_verification_after_a_lucky_first_canary() -> None:
    """The first canary passes; 3 of the 5 verify requests (sent at once, one each) fail."""
    sd, gw = FakeSystemd(), FakeGateway()
    answered = itertools.count()

    def half(count: int) -> CanaryResult:
        assert count == 1
        if next(answered) % 2 == 0:  # the first canary, then the 2nd and 4th verify request
            return CanaryResult(True, 1, 0, 0.01)
        return CanaryResult(False, 1, 1, None, "decode answered HTTP 500")

    ops = fake_ops(sd, gw, canaries=FakeCanaries(half))
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[:1])
    assert not rep.ok and (rep.error or "").startswith("verify: 3/5 requests failed")
    assert not any(c.startswith("add") for c in gw.calls)


def test_the_verify_requests_go_at_once() -> None:
    """Each of the 5 waits until all 5 are under way: sent one after another, the first
    would wait alone and the restart fail."""
    together = threading.Barrier(CANARIES_VERIFY, timeout=5)

    class Together(FakeCanaries):
        def group(self, legs: list[Leg], count: int) -> CanaryResult:
            together.wait()
            return super().group(legs, count)

    ops = fake_ops(FakeSystemd(), FakeGateway(), canaries=Together())
    (rep,) = restart.restart_pairs(ops, ops.source.pairs()[:1])
    assert rep.ok, rep.error


def test_router_restart_waits_for_readiness_and_touches_no_engine() -> None:
    sd, gw = FakeSystemd(), FakeGateway()
    (rep,) = restart.restart_gateways(fake_ops(sd, gw))
    assert rep.ok and rep.lines == ["OK: node-a/gateway (pdstack-gateway.service)"]
    assert sd.jobs == [("restart", ("pdstack-gateway.service",))]
    assert gw.calls.count("readiness") == 3


def test_lone_restart_times_out_with_the_journal() -> None:
    sd = FakeSystemd()
    ops = fake_ops(sd, FakeGateway(), engines=FakeEngines(lambda url: EngineProbe(url, "HTTP 503")))
    rep = restart.restart_instance(ops, ops.source.instance("node-a/pd0-decode"))
    assert not rep.ok and rep.error == "health: not healthy after 0s"
    assert sd.jobs == [("restart", ("pdstack-pd0-decode.service",))]
    assert rep.lines[0].startswith("FAILED: node-a/pd0-decode")
    assert list(rep.journal) == ["pdstack-pd0-decode.service"]


def test_ctrl_c_during_a_restart_names_the_pair_and_the_phase() -> None:
    class Interrupting(FakeSystemd):
        def start(self, *units: str) -> None:
            raise KeyboardInterrupt

    sd, gw = Interrupting(), FakeGateway()
    ops = fake_ops(sd, gw)
    with pytest.raises(restart.Interrupted) as e:
        restart.restart_pairs(ops, ops.source.pairs())
    msg = str(e.value)
    assert msg.startswith("interrupted during start of group node-a/pd0: it is out of the gateway")
    assert "engines may be stopped or starting" in msg
    assert msg.endswith("Put it back with: pdctl restart --both --pair node-a/pd0")
    assert e.value.exit_code == 130
    assert gw.calls == ["remove http://10.0.0.1:30000", "remove http://10.0.0.1:30001"]


@pytest.mark.parametrize(
    ("phase", "first"),
    [
        ("drain", "canary"),  # its engines never stopped: check them, register them again
        ("stop", "drain"),  # down or half down: the whole restart
        ("start", "drain"),
        ("health", "health"),  # new engines were started: wait for them
        ("verify", "health"),
        ("register", "health"),
    ],
)
def test_an_abandoned_restart_is_taken_up_where_its_engines_are(phase: str, first: str) -> None:
    steps = finish.resume_steps(phase)
    assert steps[0] == first and steps[-1] == "register"
    assert list(steps) == list(restart.PHASES[restart.PHASES.index(first) :])


class _Records:
    """The phase records a restart writes (pdctl.coord.restarts.Phases' calls)."""

    def __init__(self) -> None:
        self.entered: list[tuple[str, str]] = []
        self.ended: list[str] = []

    def enter(self, target: str, phase: str) -> bool:
        self.entered.append((target, phase))
        return True

    def done(self, target: str) -> bool:
        self.ended.append(target)
        return True


class _DiesDraining(FakeGateway):
    """Takes the DELETEs, then is killed before it says the workers are drained."""

    def wait(self, pred: object, timeout: float, step: float = 0.25) -> bool:
        raise gateway.GatewayUnreachable(f"gateway {self.url}: ConnectionError: refused")


def test_a_gateway_killed_during_the_drain_leaves_the_pair_for_pdctl_finish() -> None:
    """The drain fails, nothing is stopped, and the pair is out of the gateways that took its
    removal: its record stays, so pdctl finish registers its untouched engines again."""
    sd, records = FakeSystemd(), _Records()
    ops = fake_ops(sd, _DiesDraining("http://gw1:8000"))
    pair = ops.source.pairs()[0]
    rep = restart.restart_pair(ops, pair, phases=cast(Phases, records))
    assert not rep.ok and (rep.error or "").startswith("drain: gateway http://gw1:8000")
    assert (rep.error or "").endswith("nothing was stopped") and sd.jobs == []
    assert records.entered == [(pair.id, "drain")] and records.ended == []
    assert finish.resume_steps("drain")[0] == "canary"  # undone: canary, then registered


class _DiesRegistering(FakeGateway):
    """Takes the pair's registration, then is killed before it marks the workers ready."""

    def register(self, regs: Iterable[gateway.Registration], prune: bool = False) -> dict[str, str]:
        super().register(regs, prune)
        raise gateway.GatewayUnreachable(f"gateway {self.url}: ConnectionError: reset")


def test_a_gateway_killed_during_the_register_leaves_the_pair_for_pdctl_finish() -> None:
    """The new engines serve; one gateway dies while taking them: the restart stops there,
    says so in one line, and keeps its record, so pdctl finish (a recovery: it skips a
    gateway that does not answer) takes it up from the health wait."""
    sd, records = FakeSystemd(), _Records()
    ops = fake_ops(sd, _DiesRegistering("http://gw1:8000"))
    pair = ops.source.pairs()[0]
    rep = restart.restart_pair(ops, pair, phases=cast(Phases, records))
    assert not rep.ok and (rep.error or "").startswith(
        "register: gateway http://gw1:8000: ConnectionError: reset: it went away during the "
        "register; the group is left for pdctl finish"
    )
    assert "stays out of the gateway" not in (rep.error or "")
    assert [v for v, _ in sd.jobs if v != "reset-failed"] == ["stop", "start"]
    assert records.entered[-1] == (pair.id, "register") and records.ended == []
    assert finish.resume_steps("register")[0] == "health"


@pytest.mark.parametrize("how", ["ok", "canary fails", "lock lost"])
def test_the_phase_record_goes_once_the_restart_said_how_it_ended(how: str) -> None:
    """Done, or a step after the drain failed (the pair stays out for the operator, as its
    report says): the record goes. The lock lost: it stays, for whoever holds the lock now
    (pdctl finish)."""
    answer = CanaryResult(how != "canary fails", 1, int(how == "canary fails"), None, "HTTP 500")
    ops = fake_ops(FakeSystemd(), FakeGateway(), canaries=FakeCanaries(lambda _n: answer))
    ops.timeouts = replace(ops.timeouts, canary=0.1, poll=0.01)
    reasons = iter([None, None, LOST if how == "lock lost" else None] + [None] * 4)
    records, pair = _Records(), ops.source.pairs()[0]
    rep = restart.restart_pair(
        ops, pair, lock_lost=lambda: next(reasons), phases=cast(Phases, records)
    )
    assert rep.ok is (how == "ok")
    assert records.entered[:2] == [(pair.id, "drain"), (pair.id, "stop")]
    assert records.ended == ([] if how == "lock lost" else [pair.id])


@pytest.mark.parametrize("fleet_lock", [True, False])
def test_ctrl_c_says_who_takes_the_restart_up(fleet_lock: bool) -> None:
    """Under the fleet lock the interrupted restart keeps its phase record, which
    pdstack-finish.timer takes up once the lock is free: the message says so. Without it
    (--no-fleet-lock) no record exists, and only the operator's command puts it back."""

    class Interrupting(FakeSystemd):
        def start(self, *units: str) -> None:
            raise KeyboardInterrupt

    ops, records = fake_ops(Interrupting(), FakeGateway()), _Records()
    pair = ops.source.pairs()[0]
    with pytest.raises(restart.Interrupted) as e:
        restart.restart_pair(ops, pair, phases=cast(Phases, records) if fleet_lock else None)
    msg = str(e.value)
    assert msg.endswith(f"Put it back with: pdctl restart --both --pair {pair.id}")
    assert ("pdstack-finish.timer takes up its restart where it stopped" in msg) is fleet_lock
    if fleet_lock:
        assert records.entered[-1] == (pair.id, "start") and records.ended == []


class _StoreGoesAway(_Records):
    def enter(self, target: str, phase: str) -> bool:
        if phase == "start":
            raise StoreUnavailable("cannot write: etcd has no quorum")
        return super().enter(target, phase)


def test_a_phase_etcd_cannot_record_stops_the_restart_and_keeps_its_record() -> None:
    """Stopped, then etcd cannot take the next phase: the restart stops as if the lock were
    lost (it cannot prove it holds it), and leaves its record for pdctl finish."""
    sd, records = FakeSystemd(), _StoreGoesAway()
    ops = fake_ops(sd, FakeGateway())
    rep = restart.restart_pair(ops, ops.source.pairs()[0], phases=cast(Phases, records))
    assert not rep.ok and (rep.error or "").startswith("start: stopped before it:")
    assert "etcd cannot record its phase: cannot write: etcd has no quorum" in (rep.error or "")
    assert [v for v, _ in sd.jobs] == ["stop"] and records.ended == []
