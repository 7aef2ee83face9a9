"""The lanes of `make test`: benchmarks/suite_lanes.py turns the lane log into each lane's chain
of modules (a module's phases merge into one span, in the lane that ran it, ordered by start),
and the scheduler binds a long unit of work only behind short work (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import benchmark, next_unit


def _line(worker: str, nodeid: str, when: str, start: float, stop: float) -> dict[str, object]:
    return {"worker": worker, "nodeid": nodeid, "when": when, "start": start, "stop": stop}


def test_a_modules_phases_merge_into_one_span_per_lane_in_start_order() -> None:
    lines = [
        _line("gw1", "tests/b.py::test_x", "setup", 105.0, 110.0),
        _line("gw1", "tests/b.py::test_x", "call", 110.0, 130.0),
        _line("gw0", "tests/a.py::test_one", "setup", 100.0, 101.0),
        _line("gw0", "tests/a.py::test_one", "call", 101.0, 140.0),
        _line("gw0", "tests/c.py::test_z[1]", "call", 150.0, 155.0),
        _line("gw1", "tests/b.py::test_y", "teardown", 131.0, 170.0),
        _line("gw10", "tests/d.py::test_w", "call", 100.0, 102.0),
    ]
    lanes = benchmark("suite_lanes").lanes(lines)
    assert list(lanes) == ["gw0", "gw1", "gw10"]  # by worker number, not as strings
    assert lanes["gw0"] == [
        {"module": "tests/a.py", "start": 0.0, "end": 40.0},
        {"module": "tests/c.py", "start": 50.0, "end": 55.0},
    ]
    assert lanes["gw1"] == [{"module": "tests/b.py", "start": 5.0, "end": 70.0}]


def test_behind_a_long_unit_a_lane_binds_a_short_one_and_a_long_one_behind_short_work() -> None:
    fleet, roll = "tests/e2e/test_fleet.py", "tests/e2e/test_site_roll.py"
    monitoring = "tests/integration/test_monitoring_gateway.py"
    short, other = "tests/unit/test_lint.py", "tests/unit/test_bench.py"
    assert next_unit([fleet], [roll, monitoring, short, other]) == short
    assert next_unit(["session-host"], [monitoring, other]) == other
    assert next_unit([monitoring], [roll, monitoring]) == roll  # only long units left
    assert next_unit([short], [monitoring, other]) == monitoring
    assert next_unit([], [roll, short]) == roll  # a lane's first unit: the queue's head
