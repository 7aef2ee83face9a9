"""pdctl.ops.roll: --max-unavailable and --min-serving parsing, the capacity floor from the
gateways' view, the order, and the scheduler over a stand-in restart step (at most K out, a
failure stops new starts, the rest listed untouched, Ctrl-C names every group out)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from pdctl.coord.restarts import Phases
from pdctl.errors import PdctlError
from pdctl.ops import roll
from pdctl.ops.context import Ops, Timeouts
from pdctl.ops.gateway import GatewayWorker
from pdctl.ops.report import PHASES, Interrupted, Report
from pdctl.ops.source import Pair, Source
from pdctl.topology import Topology
from tests.conftest import ROOT, benchmark
from tests.unit.ops_fakes import topo as topology


def fleet(hosts: tuple[str, ...] = ("a", "b"), per_host: int = 2) -> Topology:
    return topology(hosts, tuple(f"pd{n}" for n in range(per_host)))


class ViewGateway:
    """A gateway that routes to the groups in `routed` (their workers ready and healthy)."""

    url = "http://gw:8000"

    def __init__(self, pairs: list[Pair], routed: set[str]) -> None:
        self.pairs, self.routed = pairs, routed

    def workers(self) -> list[GatewayWorker]:
        return [
            GatewayWorker(i.url, i.url, i.role.value, "ready", True, 0, p.id)
            for p in self.pairs
            if p.id in set(self.routed)
            for i in p.instances
        ]


def fake_ops(topo: Topology, routed: set[str] | None = None) -> tuple[Ops, list[Pair], set[str]]:
    pairs = Source(topo, None).pairs()
    routed = {p.id for p in pairs} if routed is None else routed
    ops = Ops(
        Source(topo, None),
        lambda _h: None,  # type: ignore[arg-type,return-value]
        [ViewGateway(pairs, routed)],  # type: ignore[list-item]
        Timeouts(floor=0.05, poll=0.01),
        say=lambda _l: None,
    )
    return ops, pairs, routed


# ----- parsing and the budget -------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "groups", "k"),
    [("2", 4, 2), ("4", 4, 4), ("25%", 4, 1), ("50%", 4, 2), ("10%", 3, 1), ("100%", 16, 16)],
)
def test_max_unavailable_is_a_count_or_a_percentage_rounded_down_at_least_one(
    text: str, groups: int, k: int
) -> None:
    assert roll.max_unavailable(text, groups) == k


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "--max-unavailable 0: at least one group must be let out at a time"),
        ("-1", "--max-unavailable -1: at least one group"),
        ("0%", "--max-unavailable 0%: at least one group"),
        ("150%", "--max-unavailable 150%: a percentage is at most 100%"),
        ("abc", "--max-unavailable 'abc': give a count of groups (2) or a percentage"),
        ("2.5", "--max-unavailable '2.5': give a count"),
        ("5", "--max-unavailable 5 is more than the fleet's 4 groups"),
    ],
)
def test_bad_max_unavailable_says_why(text: str, message: str) -> None:
    with pytest.raises(PdctlError) as e:
        roll.max_unavailable(text, 4)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_floor_defaults_to_all_groups_but_k_and_an_impossible_one_names_both() -> None:
    assert roll.budget(None, None, 4) is roll.ONE  # the plain roll: no floor
    assert roll.budget("2", None, 4) == roll.Budget(2, 2)
    assert roll.budget("50%", 1, 4) == roll.Budget(2, 1)
    assert roll.budget(None, 2, 4) == roll.Budget(1, 2)
    with pytest.raises(PdctlError, match=r"--min-serving 4: the fleet has 4 groups, so none"):
        roll.budget("1", 4, 4)
    with pytest.raises(
        PdctlError,
        match=r"--max-unavailable 50% \(2 groups\) and --min-serving 3 cannot both hold: "
        r"with 2 of the fleet's 4 groups out, 2 serve",
    ):
        roll.budget("50%", 3, 4)


# ----- the gateways' view, the order, the checks before anything stops ----------------------
def test_serving_counts_a_group_only_where_every_answering_gateway_routes_all_its_members() -> None:
    ops, pairs, routed = fake_ops(fleet())
    assert roll.serving(ops, pairs) == routed
    half = ViewGateway(pairs, routed)
    half.workers = lambda: [w for w in ViewGateway(pairs, routed).workers() if "30001" not in w.url]  # type: ignore[method-assign]
    ops.gateways.append(half)  # type: ignore[arg-type]
    assert roll.serving(ops, pairs) == routed - {"a/pd0", "b/pd0"}  # their decode is not there
    assert roll.left_serving(routed, {"a/pd1"}, "b/pd1") == 2


def test_order_keeps_each_hosts_groups_in_a_row_and_drained_ones_first() -> None:
    topo = fleet(("a", "b", "c"), 2)
    pairs = Source(topo, None).pairs()
    shuffled = [pairs[4], pairs[1], pairs[2], pairs[5], pairs[0], pairs[3]]
    ids = [p.id for p in roll.order(shuffled, topo)]
    assert ids == ["a/pd1", "a/pd0", "b/pd0", "b/pd1", "c/pd0", "c/pd1"]
    ids = [p.id for p in roll.order(shuffled, topo, {"b/pd1"})]
    assert ids == ["b/pd1", "a/pd1", "a/pd0", "b/pd0", "c/pd0", "c/pd1"]


def test_a_chosen_group_out_of_the_gateways_is_refused_unless_included() -> None:
    ops, pairs, routed = fake_ops(fleet())
    routed.discard("b/pd0")
    with pytest.raises(PdctlError, match=r"out of the gateways already: b/pd0 .*--include-drained"):
        roll.prepare(ops, pairs, 2, include_drained=False)
    assert roll.prepare(ops, pairs, 2, include_drained=True)[0].id == "b/pd0"


def test_a_floor_the_first_group_would_break_now_is_refused_before_anything_stops() -> None:
    ops, pairs, routed = fake_ops(fleet())
    routed.discard("b/pd1")  # not in the roll, out of the gateways
    with pytest.raises(PdctlError) as e:
        roll.prepare(ops, pairs[:1], 3, include_drained=False)
    assert str(e.value) == (
        "the gateways route to 3 of 4 groups; taking a/pd0 out would leave 2, below --min-serving 3"
    )
    ops.gateways.clear()
    with pytest.raises(PdctlError, match="no gateway answered, so the capacity floor cannot"):
        roll.prepare(ops, pairs, 3, include_drained=False)


def test_time_left_from_the_phase_times_of_the_groups_done() -> None:
    assert roll.time_left([], [5.0], 3, 2) is None
    # Mean 100 s; one group out for 40 s, 3 not started, 2 lanes. Lane 1 is free now, lane 2
    # in 60 s: the first waiting group runs 0-100, the second 60-160, the third 100-200. The
    # work over the lanes, (300 + 60) / 2 = 180 s, would leave the third group's last 20 s out.
    assert roll.time_left([90.0, 110.0], [40.0], 3, 2) == pytest.approx(200.0)
    assert roll.time_left([100.0], [], 1, 4) == pytest.approx(100.0)  # one lane used
    assert roll.time_left([100.0], [150.0], 0, 2) == 0.0  # out longer than the mean


@pytest.mark.parametrize(("n", "k", "waves"), [(4, 1, 4), (4, 2, 2), (5, 2, 3), (32, 3, 11)])
def test_finish_from_a_cold_start_is_whole_waves(n: int, k: int, waves: int) -> None:
    assert roll.finish([], [50.0] * n, k) == pytest.approx(waves * 50.0)


def test_finish_starts_each_waiting_group_on_the_first_lane_free_in_order() -> None:
    # Lanes free at 10 and 30: 40 runs 10-50, 5 runs 30-35, 5 runs 35-40.
    assert roll.finish([30.0, 10.0], [40.0, 5.0, 5.0], 2) == pytest.approx(50.0)
    assert roll.finish([], [], 3) == 0.0


def test_lanes_are_k_less_what_groups_already_out_take_from_the_floor() -> None:
    assert roll.lanes(roll.ONE, 8) == 1
    assert roll.lanes(roll.budget("3", None, 8), 8) == 3  # floor 5: N - D - floor = 3
    assert roll.lanes(roll.budget("3", None, 8), 8, down=2) == 1
    assert roll.lanes(roll.budget("3", None, 8), 8, down=5) == 1  # waits for the floor
    assert roll.lanes(roll.budget("3", 2, 8), 8, down=2) == 3  # a lower floor leaves room


def test_the_roll_time_table_in_the_docs_is_the_one_the_model_prints() -> None:
    """docs/restart.md's table is benchmarks/roll_model.py's output, not typed by hand."""
    model = benchmark("roll_model")
    table = "\n".join(model.table())
    assert table in (ROOT / "docs" / "restart.md").read_text()
    # The model is the scheduler's: 32 groups of 220 s at 25% (K = 8) are 4 waves.
    assert model.roll_seconds(32, "25%", 220.0) == pytest.approx(4 * 220.0)


# ----- the scheduler over a stand-in step -------------------------------------------------
class Steps:
    """restart_pair's stand-in: takes the group out of the gateway view, runs its phases
    (asking the fence before each), puts it back. Records how many are out at once and the
    least the gateways routed to."""

    def __init__(self, routed: set[str], k: int, fail: str | None = None) -> None:
        self.routed, self.k, self.fail = routed, k, fail
        self.lock = threading.Lock()
        self.out: set[str] = set()
        self.started: list[str] = []
        self.most_out, self.least_routed = 0, len(routed)
        self.all_k_out = threading.Event()  # the first K wait here: serial runs cannot pass
        self.fences = 0
        self.hold: dict[tuple[str, str], threading.Event] = {}  # (group, phase): wait there

    def __call__(
        self,
        ops: Ops,
        pair: Pair,
        *,
        lock_lost: Callable[[], str | None],
        on_phase: Callable[[str], None],
        phases: Phases | None = None,
    ) -> Report:
        with self.lock:
            self.started.append(pair.id)
            self.out.add(pair.id)
            self.routed.discard(pair.id)
            self.most_out = max(self.most_out, len(self.out))
            self.least_routed = min(self.least_routed, len(self.routed))
            if len(self.out) == self.k:
                self.all_k_out.set()
        rep = Report(pair.id)
        for phase in PHASES:
            on_phase(phase)
            with self.lock:
                self.fences += 1
            if lock_lost() is not None:
                return Report(pair.id, ok=False, error="lost")
            if phase == "stop" and len(self.started) <= self.k:
                assert self.all_k_out.wait(10)
            if (pair.id, phase) in self.hold:
                assert self.hold[pair.id, phase].wait(10)
            if pair.id == self.fail and phase == "health":
                with self.lock:
                    self.out.discard(pair.id)  # a failed group stays out of the gateway
                return Report(pair.id, ok=False, error="health: not healthy", phases={"health": 1})
            rep.phases[phase] = 1.0
        with self.lock:
            self.out.discard(pair.id)
            self.routed.add(pair.id)
        return rep


def test_at_most_k_groups_are_out_and_the_floor_holds_throughout() -> None:
    ops, pairs, routed = fake_ops(fleet(("a", "b", "c"), 2))
    steps = Steps(routed, 2)
    lines: list[str] = []
    ops.say = lines.append
    reports = roll.run(ops, pairs, steps, roll.budget("2", None, 6), lambda: None)
    assert sorted(r.target for r in reports) == sorted(p.id for p in pairs)
    assert all(r.ok for r in reports)
    assert steps.most_out == 2 and steps.least_routed == 4
    assert steps.started[:2] == ["a/pd0", "a/pd1"]  # one host's groups together
    assert steps.fences == len(PHASES) * 6  # the fencing check before every step of every group
    assert any(line.startswith("roll: out a/pd0, a/pd1; done 0 of 6; left 4") for line in lines)
    assert any("about" in line and "to go" in line for line in lines)


def test_a_group_out_of_the_gateways_before_the_roll_counts_against_the_floor() -> None:
    ops, pairs, routed = fake_ops(fleet())
    routed.discard("b/pd1")  # out already, not rolled: K 2 leaves room for one at a time
    steps = Steps(routed, 1)
    lines: list[str] = []
    ops.say = lines.append
    reports = roll.run(ops, pairs[:3], steps, roll.budget("2", None, 4), lambda: None)
    assert [r.ok for r in reports] == [True] * 3
    assert steps.most_out == 1 and steps.least_routed == 2
    assert (
        "roll: holding a/pd1 back: the gateways route to 2 of 4 groups; taking a/pd1 out "
        "would leave 1, below --min-serving 2; waiting for a group to return"
    ) in lines
    # The time to go counts the one lane the floor leaves (N - D - floor = 4 - 1 - 2), not K:
    # two groups of 7 s (the stand-in's phases) one after the other.
    assert "roll: out none; done 1 of 3; left 2; about 14s to go" in lines


def test_a_floor_never_met_stops_the_roll_after_the_floor_timeout() -> None:
    ops, pairs, routed = fake_ops(fleet())
    routed.discard("b/pd1")
    routed.discard("b/pd0")
    lines: list[str] = []
    ops.say = lines.append
    steps = Steps(routed, 1)
    reports = roll.run(ops, pairs[:2], steps, roll.budget("2", None, 4), lambda: None)
    assert steps.started == []
    (rep,) = reports
    assert not rep.ok and rep.target == "a/pd0"
    assert rep.error == (
        "not started: the gateways route to 2 of 4 groups; taking a/pd0 out would leave 1, "
        "below --min-serving 2 after 0s"
    )
    assert lines[-1] == "stopping the roll; untouched: a/pd0, a/pd1"


def test_the_first_failure_stops_new_starts_those_out_finish_and_the_rest_are_listed() -> None:
    ops, pairs, routed = fake_ops(fleet(("a", "b", "c"), 2))
    steps = Steps(routed, 2, fail="a/pd1")
    reaped = steps.hold["a/pd0", "register"] = threading.Event()  # until a/pd1's end is seen
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if "; done 1 of 6" in line:
            reaped.set()

    ops.say = say
    reports = roll.run(ops, pairs, steps, roll.budget("2", None, 6), lambda: None)
    assert sorted(steps.started) == ["a/pd0", "a/pd1"]
    assert [(r.target, r.ok) for r in reports] == [("a/pd1", False), ("a/pd0", True)]
    assert lines[-1] == "stopping the roll; untouched: b/pd0, b/pd1, c/pd0, c/pd1"


@pytest.mark.parametrize("recorded", [False, True])
def test_ctrl_c_names_every_group_out_and_the_others_stop_before_their_next_step(
    recorded: bool,
) -> None:
    """With phase records (the fleet lock's), the message adds that pdstack-finish.timer
    takes up the restarts in flight; the command that puts them back stays last."""
    ops, pairs, _ = fake_ops(fleet())
    phases = cast(Phases, object()) if recorded else None  # the fake step writes none
    in_canary, release, ended = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []

    def step(
        ops: Ops,
        pair: Pair,
        *,
        lock_lost: Callable[[], str | None],
        on_phase: Callable[[str], None],
        phases: Phases | None = None,
    ) -> Report:
        if pair.id == "a/pd1":
            on_phase("health")
            assert in_canary.wait(10)
            raise Interrupted(pair.id, "health")  # restart_pair's word for a ^C in its step
        try:
            for phase in PHASES:
                on_phase(phase)
                lock_lost()
                ran.append(phase)
                if phase == "canary":
                    in_canary.set()
                    assert release.wait(10)
            return Report(pair.id)
        finally:
            ended.set()

    with pytest.raises(Interrupted) as e:
        roll.run(ops, pairs, step, roll.budget("2", None, 4), lambda: None, phases)
    release.set()
    assert ended.wait(10)
    msg = str(e.value)
    assert msg.startswith("interrupted with 2 groups out: ")
    finisher = "pdstack-finish.timer takes up the restarts in flight where they stopped"
    assert (finisher in msg) is recorded
    assert "a/pd0 during canary: it is out of the gateway (drained);" in msg
    assert "a/pd1 during health: it is out of the gateway (drained) and its engines may be" in msg
    assert msg.endswith("Put them back with: pdctl restart --both --pair a/pd0 --pair a/pd1")
    assert e.value.exit_code == 130
    assert ran == list(PHASES[: PHASES.index("canary") + 1])  # a/pd0 stopped before verify


def test_a_ctrl_c_while_the_roll_waits_names_every_group_out() -> None:
    """A real SIGINT reaches the calling thread, which waits for its groups' ends."""
    ops, pairs, _ = fake_ops(fleet())
    release, lock = threading.Event(), threading.Lock()
    waiting: list[str] = []
    # To the calling thread: a process-wide kill() may land on the sending worker thread,
    # and then Python runs the handler only when the blocked main thread next wakes.
    caller = threading.get_ident()

    def step(
        ops: Ops,
        pair: Pair,
        *,
        lock_lost: Callable[[], str | None],
        on_phase: Callable[[str], None],
        phases: Phases | None = None,
    ) -> Report:
        for phase in PHASES:
            on_phase(phase)
            lock_lost()
            if phase == "health":
                with lock:
                    waiting.append(pair.id)
                    if len(waiting) == 2:
                        signal.pthread_kill(caller, signal.SIGINT)
                assert release.wait(10)
        return Report(pair.id)

    # Python's own ^C handler, as pdctl runs under: this worker process may have run code
    # that left SIGINT ignored (seen after integration modules in the suite's lanes), and an
    # ignored SIGINT never reaches the roll.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted) as e:
            roll.run(ops, pairs, step, roll.budget("2", None, 4), lambda: None)
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
    msg = str(e.value)
    assert "a/pd0 during health: it is out of the gateway (drained) and its engines" in msg
    assert "a/pd1 during health: it is out of the gateway (drained) and its engines" in msg
    assert msg.endswith("Put them back with: pdctl restart --both --pair a/pd0 --pair a/pd1")


def test_one_at_a_time_without_a_floor_runs_in_the_calling_thread() -> None:
    """The plain roll: no gateway read for a floor (the gateways may not even answer)."""
    ops, pairs, _ = fake_ops(fleet())
    ops.gateways.clear()
    threads: list[str] = []

    def step(ops: Ops, pair: Pair, **_: Any) -> Report:
        threads.append(threading.current_thread().name)
        return Report(pair.id, phases={"drain": 1.0})

    reports = roll.run(ops, pairs, step, roll.ONE, lambda: None)
    assert [r.target for r in reports] == [p.id for p in pairs]
    assert set(threads) == {threading.current_thread().name}
