"""The lanes of `make test` (tests/lanes.py): work units from the collection (the session
host's modules one unit), their order, long units and the critical one from the recorded
durations; the scheduler binds a long unit only behind short work; a run's lane log becomes
per-module durations and, in benchmarks/suite_lanes.py, each lane's chain of modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, benchmark
from tests.lanes import (
    LANE_NICE,
    NICE0_PER_LANE_NICE,
    SESSION_HOST_UNIT,
    Durations,
    Module,
    Plan,
    collected_modules,
    next_unit,
    nices,
    plan,
    read_durations,
    record_durations,
    spans,
)

pytest_plugins = ["pytester"]


def _line(
    worker: str, nodeid: str, when: str, start: float, stop: float, nice: int | None = None
) -> dict[str, object]:
    line = {"worker": worker, "nodeid": nodeid, "when": when, "start": start, "stop": stop}
    return line if nice is None else {**line, "nice": nice}


def test_a_modules_phases_merge_into_one_span_per_lane_in_start_order() -> None:
    lines = [
        _line("gw1", "tests/b.py::test_x", "setup", 105.0, 110.0),
        _line("gw1", "tests/b.py::test_x", "call", 110.0, 130.0),
        {**_line("gw0", "tests/a.py::test_one", "setup", 100.0, 101.0), "cpu": 0.5},
        {**_line("gw0", "tests/a.py::test_one", "call", 101.0, 140.0), "cpu": 12.5},
        _line("gw0", "tests/c.py::test_z[1]", "call", 150.0, 155.0),
        _line("gw1", "tests/b.py::test_y", "teardown", 131.0, 170.0),
        _line("gw10", "tests/d.py::test_w", "call", 100.0, 102.0),
    ]
    lanes = benchmark("suite_lanes").lanes(lines)
    assert list(lanes) == ["gw0", "gw1", "gw10"]  # by worker number, not as strings
    assert lanes["gw0"] == [  # a row without "cpu" (an older log) counts 0
        {"module": "tests/a.py", "start": 0.0, "end": 40.0, "cpu": 13.0},
        {"module": "tests/c.py", "start": 50.0, "end": 55.0, "cpu": 0.0},
    ]
    assert lanes["gw1"] == [{"module": "tests/b.py", "start": 5.0, "end": 70.0, "cpu": 0.0}]
    assert spans(lines) == {"tests/a.py": 40.0, "tests/b.py": 65.0, "tests/c.py": 5.0,
                            "tests/d.py": 2.0}  # fmt: skip


def test_a_run_merges_its_modules_durations_over_the_last_record(tmp_path: Path) -> None:
    here, other = "tests/unit/test_suite_lanes.py", "tests/unit/test_lint.py"
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({here: 5.0, other: 7.0, "tests/unit/test_gone.py": 3.0}))
    log = tmp_path / "lanes.jsonl"
    log.write_text(json.dumps(_line("gw0", f"{here}::test_x", "call", 10.0, 12.5, 5)) + "\n")
    record_durations(log, record, ROOT)
    # This run's module updated, the one it did not run kept, the deleted one dropped; the
    # nice this run's module ran at beside the seconds, under a key that is no module.
    assert json.loads(record.read_text()) == {here: 2.5, other: 7.0, "nice": {here: 5}}


def test_a_modules_nice_is_the_highest_its_phases_ran_at_and_old_lines_have_none() -> None:
    lines = [
        _line("gw0", "tests/a.py::test_one", "setup", 100.0, 101.0, 0),
        _line("gw0", "tests/a.py::test_one", "call", 101.0, 140.0, 5),
        _line("gw1", "tests/b.py::test_x", "call", 110.0, 130.0, 0),
        _line("gw2", "tests/c.py::test_z", "call", 150.0, 155.0),  # a log from before nice
    ]
    assert nices(lines) == {"tests/a.py": 5, "tests/b.py": 0}


def test_a_record_keeps_each_modules_nice_until_that_module_is_recorded_again(
    tmp_path: Path,
) -> None:
    here, other = "tests/unit/test_suite_lanes.py", "tests/unit/test_lint.py"
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({here: 9.0, other: 7.0, "nice": {here: 5, other: 0}}))
    log = tmp_path / "lanes.jsonl"
    # A log written before rows carried their nice: the new seconds' level is unknown.
    log.write_text(json.dumps(_line("gw0", f"{here}::test_x", "call", 10.0, 12.0)) + "\n")
    record_durations(log, record, ROOT)
    recorded = read_durations(record)
    assert recorded == Durations({here: 2.0, other: 7.0}, {other: 0})


def test_a_durations_file_without_nice_levels_reads_as_nice_0_and_the_new_one_reads_old(
    tmp_path: Path,
) -> None:
    """Backward compatible both ways: a file of plain seconds (before nice was recorded) is
    scheduled as it was, unscaled; a file with nice levels still maps each module to plain
    seconds for a reader that knows no nice (an older checkout's tests/lanes.py)."""
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"e2e/fleet.py": 1752.7, "e2e/site.py": 864.2}))
    assert read_durations(old).at_nice0() == {"e2e/fleet.py": 1752.7, "e2e/site.py": 864.2}
    new.write_text(Durations({"e2e/fleet.py": 1752.7}, {"e2e/fleet.py": LANE_NICE}).to_json())
    assert json.loads(new.read_text())["e2e/fleet.py"] == 1752.7
    # Later files over earlier ones, each module's level from the file its seconds came from.
    both = read_durations(new, old)
    assert both == Durations({"e2e/fleet.py": 1752.7, "e2e/site.py": 864.2}, {})
    assert read_durations(old, new).at_nice0()["e2e/fleet.py"] == 1752.7 * NICE0_PER_LANE_NICE


def test_a_unit_that_waited_at_lane_nice_is_compared_by_its_nice0_estimate() -> None:
    """The critical lane stays put from run to run. tests/durations.json's case: the fleet
    took 1752.7 s at nice 5 beside the session host's 864.2 s at nice 0; the fleet then runs
    at nice 0 (about 1000 s) and the session host at nice 5 (about 864.2 / 0.57 s): by the raw
    seconds the next run would make the session host critical again, and so on."""
    modules = [FLEET, SITE]
    first = Durations({FLEET.path: 1752.7, SITE.path: 864.2}, {FLEET.path: LANE_NICE, SITE.path: 0})
    assert plan(modules, first.at_nice0(), workers=2).critical == FLEET.path
    then = Durations({FLEET.path: 998.0, SITE.path: 1516.1}, {FLEET.path: 0, SITE.path: LANE_NICE})
    assert plan(modules, then.at_nice0(), workers=2).critical == FLEET.path
    assert plan(modules, then.seconds, workers=2).critical == SESSION_HOST_UNIT  # unscaled
    # A level other than 0 and LANE_NICE scales geometrically: twice LANE_NICE, the share twice.
    twice = Durations({FLEET.path: 100.0}, {FLEET.path: 2 * LANE_NICE}).at_nice0()
    assert twice[FLEET.path] == pytest.approx(100.0 * NICE0_PER_LANE_NICE**2)


def test_the_session_hosts_users_are_one_unit_through_any_fixture(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(scope="session")
        def testhost():
            return "host"

        @pytest.fixture(scope="session")
        def site(testhost):
            return testhost
        """
    )
    pytester.makepyfile(
        test_direct="def test_a(testhost): pass",
        test_through_site="def test_b(site): pass",
        test_one_of_two="import pytest\n"
        "@pytest.fixture(scope='module')\ndef converged(site): pass\n"
        "def test_c(): pass\n"
        "def test_d(converged): pass\n",
        test_own_host="import pytest\npytestmark = pytest.mark.e2e\ndef test_e(): pass",
    )
    items, _ = pytester.inline_genitems()
    modules = {m.path: m for m in collected_modules(items)}
    assert {p for p, m in modules.items() if m.uses_session_host} == {
        "test_direct.py", "test_through_site.py", "test_one_of_two.py"
    }  # fmt: skip
    assert [p for p, m in modules.items() if m.e2e] == ["test_own_host.py"]
    units = plan(list(modules.values()), {}, workers=2).units
    assert units["test_one_of_two.py"] == SESSION_HOST_UNIT
    assert units["test_own_host.py"] == "test_own_host.py"


FLEET, ROLL = Module("e2e/fleet.py", False, True), Module("e2e/roll.py", False, True)
SITE, SECURITY = Module("e2e/site.py", True, True), Module("e2e/security.py", True, True)
RESTART, LINT = Module("int/restart.py", False, False), Module("unit/lint.py", False, False)
SHORT, NEW = Module("unit/short.py", False, False), Module("unit/new.py", False, False)
RECORD = {"e2e/fleet.py": 700.0, "e2e/roll.py": 600.0, "e2e/site.py": 500.0,
          "e2e/security.py": 300.0, "int/restart.py": 200.0, "unit/lint.py": 60.0,
          "unit/short.py": 2.0}  # fmt: skip


def test_units_start_longest_first_and_the_longest_is_critical() -> None:
    lanes = plan([SHORT, NEW, LINT, RESTART, SITE, FLEET, SECURITY, ROLL], RECORD, workers=2)
    # The session host's two modules are one unit of 800 s: longer than the fleet's 700.
    assert lanes.order == [SESSION_HOST_UNIT, FLEET.path, ROLL.path, RESTART.path, LINT.path,
                           SHORT.path, NEW.path]  # fmt: skip
    assert lanes.critical == SESSION_HOST_UNIT
    # Long: at least 1/20 of a lane's share, (2362 s / 2 lanes) / 20 = 59 s.
    assert lanes.long == {SESSION_HOST_UNIT, FLEET.path, ROLL.path, RESTART.path, LINT.path}
    # In one lane, 2362 s / 20 = 118 s: ansible-lint's 60 s is short.
    one_lane = plan([SHORT, NEW, LINT, RESTART, SITE, FLEET, SECURITY, ROLL], RECORD, workers=1)
    assert one_lane.long == {SESSION_HOST_UNIT, FLEET.path, ROLL.path, RESTART.path}


def test_an_unrecorded_e2e_module_starts_with_the_e2e_units() -> None:
    fresh = Module("e2e/fresh.py", False, True)
    lanes = plan([SHORT, fresh, FLEET, ROLL, SITE], RECORD, workers=2)
    # The median recorded e2e module: 600 s, behind the fleet, beside the roll (stable).
    assert lanes.order == [FLEET.path, fresh.path, ROLL.path, SESSION_HOST_UNIT, SHORT.path]
    assert fresh.path in lanes.long
    assert lanes.critical == FLEET.path


def test_without_records_the_e2e_units_go_first_and_no_lane_is_critical() -> None:
    lanes = plan([SHORT, FLEET, LINT, SITE], {}, workers=2)
    assert lanes.order == [FLEET.path, SESSION_HOST_UNIT, SHORT.path, LINT.path]
    assert lanes.critical is None
    assert lanes.long == frozenset()


def test_the_plan_reaches_the_controller_whole() -> None:
    lanes = plan([SHORT, FLEET, SITE, SECURITY], RECORD, workers=2)
    assert Plan.from_json(lanes.to_json()) == lanes


def test_behind_a_long_unit_a_lane_binds_a_short_one_and_a_long_one_behind_short_work() -> None:
    fleet, roll, monitoring = "e2e/fleet.py", "e2e/roll.py", "int/monitoring.py"
    short, other = "unit/lint.py", "unit/bench.py"
    long = frozenset({fleet, roll, monitoring, SESSION_HOST_UNIT})
    assert next_unit([fleet], [roll, monitoring, short, other], long) == short
    assert next_unit([SESSION_HOST_UNIT], [monitoring, other], long) == other
    assert next_unit([monitoring], [roll, monitoring], long) == roll  # only long units left
    assert next_unit([short], [monitoring, other], long) == monitoring
    assert next_unit([], [roll, short], long) == roll  # a lane's first unit: the queue's head


def test_in_lanes_the_plan_reaches_xdists_scheduler_and_the_run_records_its_durations(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `-n 3 --dist loadscope` run of a small suite with the lanes plugin: the modules
    on the session host share a lane, the longest recorded unit runs at nice 0 and the others
    at LANE_NICE, and the run merges its modules' spans into .durations.json."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # tests.lanes, from the subprocess
    pytester.makeconftest(
        """
        import os
        import pytest

        pytest_plugins = ["tests.lanes"]

        @pytest.fixture(scope="session")
        def testhost():
            return "host"

        @pytest.fixture(autouse=True)
        def lane(request):
            lane = os.environ["PYTEST_XDIST_WORKER"], os.getpriority(os.PRIO_PROCESS, 0)
            with open("ran.txt", "a") as ran:
                ran.write(f"{request.node.module.__name__} {lane[0]} {lane[1]}\\n")
        """
    )
    pytester.makepyfile(
        test_host_a="def test_a(testhost): pass\ndef test_a2(testhost): pass",
        test_host_b="def test_b(testhost): pass",
        test_long="def test_c(): pass",
        test_short="def test_d(): sum(range(3_000_000))\ndef test_e(): pass",
    )
    record = {"test_long.py": 50.0, "test_host_a.py": 10.0, "test_host_b.py": 10.0}
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "durations.json").write_text(json.dumps(record))
    result = pytester.runpytest_subprocess(
        "-n", "3", "--dist", "loadscope", "--no-loadscope-reorder", "-p", "no:cacheprovider"
    )  # fmt: skip
    result.assert_outcomes(passed=6)
    ran = [line.split() for line in (pytester.path / "ran.txt").read_text().splitlines()]
    lanes = {module: {(lane, int(nice)) for m, lane, nice in ran if m == module}
             for module, _, _ in ran}  # fmt: skip
    assert len(lanes["test_host_a"] | lanes["test_host_b"]) == 1  # one lane, one priority
    assert {nice for _, nice in lanes["test_long"]} == {0}
    assert {nice for m in lanes for _, nice in lanes[m] if m != "test_long"} == {LANE_NICE}
    recorded = json.loads((pytester.path / ".durations.json").read_text())
    assert set(recorded) == {f"{m}.py" for m in lanes} | {"nice"}
    # Each lane log row says the nice its test ran at; the record keeps it per module.
    logged = [json.loads(x) for x in (pytester.path / ".lanes.jsonl").read_text().splitlines()]
    seen = {(r["nodeid"].split(".py")[0], r["nice"]) for r in logged if r["when"] == "call"}
    assert seen == {(m, nice) for m in lanes for _, nice in lanes[m]}
    assert recorded["nice"] == {f"{m}.py": 0 if m == "test_long" else LANE_NICE for m in lanes}
    # ... and the CPU its lane spent on it: test_d's sum is work, test_e's pass is next to none.
    cpu = {r["nodeid"]: r["cpu"] for r in logged if r["when"] == "call"}
    assert cpu["test_short.py::test_d"] > 0.05 > cpu["test_short.py::test_e"] >= 0


def test_every_test_module_has_a_basename_of_its_own() -> None:
    """The test folders are not packages, so pytest imports a test module by its file name
    (rootdir-based "prepend" import): two `test_X.py` in two folders stop the whole run's
    collection with "import file mismatch" (tests/unit/test_site_roll.py beside the e2e one
    did, in a fresh-clone run)."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a name"
        seen[path.name] = path
    assert "test_suite_lanes.py" in seen
