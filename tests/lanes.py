"""The lanes of `make test` (pytest-xdist, `-n N --dist loadscope --no-loadscope-reorder`), all
derived from the collection and the previous run's durations: no list of modules to keep.

- A work unit is a module (its module fixtures, a converged host or a live stack, are set up
  once), except that every module with a test that takes the session's test host (the
  `testhost` fixture of tests/e2e/conftest.py, directly or through another fixture such as
  `site`) is in one unit, `session-host`, run in one lane one module after another.
- The units start longest first, by the durations the previous runs recorded (DURATIONS, else
  the committed COMMITTED_DURATIONS), each as its nice-0 estimate (`Durations.at_nice0`); an
  e2e module not recorded yet counts as the median recorded e2e module, so it starts with the
  e2e units.
- A lane binds a long unit only behind short work (`next_unit`, in tests/lanes_xdist.py).
- The longest unit is the critical lane, at nice 0; every other unit runs at nice LANE_NICE.
  Compared by the nice-0 estimates, the critical lane stays put: by the raw seconds, the unit
  that ran at nice 0 looks shorter than the ones that waited at LANE_NICE, and the next run
  would pick another one, which then looks shorter in turn.

Each run in lanes writes LANES_LOG (every test phase's lane, start, stop and nice); a passing
`--dist loadscope` run of whole modules merges their spans and nice levels from it into
DURATIONS, which the next run schedules by.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Under the rootdir. DURATIONS is written by every run in lanes (git-ignored); a fresh clone
# (CI) has none and schedules by COMMITTED_DURATIONS, which `make durations` regenerates from a
# `make test`'s lane log.
LANES_LOG = ".lanes.jsonl"
DURATIONS = ".durations.json"
COMMITTED_DURATIONS = "tests/durations.json"

SESSION_HOST_FIXTURE = "testhost"
SESSION_HOST_UNIT = "session-host"
# A unit is long when it takes this share of a lane's share of the suite (the recorded seconds
# over the workers) or more: two of those bound in one lane while the others run dry leave a
# tail at least that long (one of 75 s in 5 lanes of about 880 s made next_unit). In 5 lanes
# of tests/durations.json that is 78 s: the integration modules of 90 s and more, the e2e ones
# and ansible-lint's.
LONG_SHARE = 1 / 20
# The priority of every unit but the critical one, it and its children (Ansible, ssh, the test
# hosts it starts): the longest lane gets the CPU it waits for and the others fill what it
# leaves. A lane gets less CPU, never a shorter wait: the tests wait for events, bounded.
LANE_NICE = 5
# A unit's seconds at nice 0 over its seconds at LANE_NICE in `make test` (5 lanes, 2 cores):
# tests/e2e/test_fleet.py took 997.6 s at nice 0 (tests/durations.json of fb29cf1) and 1752.7 s
# at nice 5 (of c9f735a), 0.57. One module's two runs, so a rough figure; it only has to rank the
# units. A record at another level (a run under `nice`, a lane that could not go back to 0
# without root) is scaled geometrically, as the kernel's weights are (`nice0_share`).
NICE0_PER_LANE_NICE = 0.57
# The durations file maps each module to its seconds, and this key (no module's path) each
# module to the nice it ran at: a reader that knows no nice levels still finds plain seconds.
NICE_KEY = "nice"


@dataclass(frozen=True)
class Module:
    """What the collection tells about one test module."""

    path: str
    uses_session_host: bool
    e2e: bool


@dataclass(frozen=True)
class Plan:
    """The lanes' schedule: each module's unit, the units in start order (longest first), the
    long ones and the critical one (None without durations)."""

    units: dict[str, str]
    order: list[str]
    long: frozenset[str]
    critical: str | None

    def to_json(self) -> str:
        return json.dumps({"units": self.units, "order": self.order, "long": sorted(self.long),
                           "critical": self.critical})  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        return cls(d["units"], d["order"], frozenset(d["long"]), d["critical"])


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(module: Module) -> str:
    return SESSION_HOST_UNIT if module.uses_session_host else module.path


def nice0_share(nice: int) -> float:
    """A unit's seconds at nice 0 over its seconds at `nice`."""
    return float(NICE0_PER_LANE_NICE ** (nice / LANE_NICE))


@dataclass(frozen=True)
class Durations:
    """The recorded seconds per module and the nice each ran at (absent: not recorded, as in a
    file written before the lane log had it; taken as nice 0, as the schedule then did)."""

    seconds: dict[str, float]
    nice: dict[str, int]

    def at_nice0(self) -> dict[str, float]:
        """Each module's seconds as if it had run at nice 0: what the schedule compares."""
        return {m: s * nice0_share(self.nice.get(m, 0)) for m, s in self.seconds.items()}

    def to_json(self) -> str:
        nice = {m: n for m, n in sorted(self.nice.items()) if m in self.seconds}
        return json.dumps({**dict(sorted(self.seconds.items())), NICE_KEY: nice}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Durations:
        d = json.loads(text)
        nice = d.pop(NICE_KEY, {})
        return cls({m: float(s) for m, s in d.items()}, {m: int(n) for m, n in nice.items()})

    def over(self, newer: Durations) -> Durations:
        """These records with `newer`'s over them: a module `newer` records takes its nice from
        `newer` alone (a level recorded with older seconds would scale the new ones)."""
        nice = {m: n for m, n in self.nice.items() if m not in newer.seconds}
        return Durations({**self.seconds, **newer.seconds}, {**nice, **newer.nice})


def module_seconds(modules: list[Module], durations: dict[str, float]) -> dict[str, float]:
    """Each module's recorded seconds; an e2e module not recorded yet: the median recorded e2e
    module (it waits on test hosts for minutes); any other: 0 (it starts last, once)."""
    e2e = [durations[m.path] for m in modules if m.e2e and m.path in durations]
    unrecorded_e2e = statistics.median(e2e) if e2e else 0.0
    return {m.path: durations.get(m.path, unrecorded_e2e if m.e2e else 0.0) for m in modules}


def plan(modules: list[Module], durations: dict[str, float], workers: int) -> Plan:
    """The schedule of the collected `modules` (in collection order) from the recorded
    `durations` (seconds per module, nice-0 estimates: `Durations.at_nice0`) on `workers`
    lanes."""
    seconds = module_seconds(modules, durations)
    unit_seconds: dict[str, float] = defaultdict(float)
    units, e2e = {}, set()
    for m in modules:
        units[m.path] = unit_of(m)
        unit_seconds[units[m.path]] += seconds[m.path]
        if m.e2e:
            e2e.add(units[m.path])
    # Without records the e2e units still go first; sorted() is stable, so units of equal
    # record keep their collection order.
    order = sorted(unit_seconds, key=lambda u: (-unit_seconds[u], u not in e2e))
    threshold = LONG_SHARE * sum(unit_seconds.values()) / workers
    long = frozenset(u for u, s in unit_seconds.items() if s > 0 and s >= threshold)
    critical = order[0] if order and unit_seconds[order[0]] > 0 else None
    return Plan(units, order, long, critical)


def next_unit(pending: list[str], queue: list[str], long: frozenset[str]) -> str:
    """The unit a lane binds next, from the queue's units in order. xdist binds it when the
    lane has 2 tests or fewer pending (a one-test unit binds its successor as it starts):
    minutes before a long unit's last tests end. So behind a long unit goes the first short
    one, and a long unit is bound only behind short work, when its lane is nearly free (two
    long units in one lane while the others ran dry made a 75 s tail)."""
    if any(u in long for u in pending):
        return next((u for u in queue if u not in long), queue[0])
    return queue[0]


def spans(lines: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Each module's seconds in a lane log: its first phase's start to its last one's stop (a
    module runs in one lane, its tests one after another)."""
    bounds: dict[str, tuple[float, float]] = {}
    for r in lines:
        m = module_of(r["nodeid"])
        start, stop = bounds.get(m, (r["start"], r["stop"]))
        bounds[m] = (min(start, r["start"]), max(stop, r["stop"]))
    return {m: round(stop - start, 1) for m, (start, stop) in bounds.items()}


def nices(lines: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Each module's nice in a lane log: the highest its phases ran at (a unit's tests share
    one); modules whose lines carry none (a log from before it was recorded) are left out."""
    found: dict[str, int] = {}
    for r in lines:
        if "nice" in r:
            m = module_of(r["nodeid"])
            found[m] = max(found.get(m, r["nice"]), r["nice"])
    return found


def read_durations(*paths: Path) -> Durations:
    """The recorded seconds and nice levels per module, later files over earlier ones."""
    found = Durations({}, {})
    for path in paths:
        if path.is_file():
            found = found.over(Durations.from_json(path.read_text()))
    return found


def record_durations(log: Path, into: Path, root: Path) -> None:
    """Merge the spans of `log`'s modules, and the nice each ran at, into `into`; modules this
    run did not run keep their last record, and modules whose file (under `root`) is gone are
    dropped."""
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    merged = read_durations(into).over(Durations(spans(lines), nices(lines)))
    kept = Durations({m: s for m, s in merged.seconds.items() if (root / m).is_file()}, merged.nice)
    into.write_text(kept.to_json() + "\n")


# The hooks. The workers collect and derive the plan; the xdist controller, which sees node
# ids only, reads it from a file each worker writes (in a directory the controller passes in
# workerinput) before it reports its collection.

PLAN_DIR = pytest.StashKey[Path]()
PLAN = pytest.StashKey[Plan]()


def plan_dir(config: pytest.Config) -> Path:
    if PLAN_DIR not in config.stash:
        config.stash[PLAN_DIR] = Path(tempfile.mkdtemp(prefix="pdstack-lanes-"))
    return config.stash[PLAN_DIR]


def workerinput(config: pytest.Config) -> dict[str, Any]:
    """What xdist gives a worker (its id, the worker count); empty in the controller or a run
    without lanes. (Not PYTEST_XDIST_WORKER: a pytest run inside a worker inherits it.)"""
    return getattr(config, "workerinput", {})


def collected_modules(items: list[pytest.Item]) -> list[Module]:
    found: dict[str, Module] = {}
    for item in items:
        path = module_of(item.nodeid)
        m = found.get(path, Module(path, False, False))
        found[path] = Module(
            path,
            m.uses_session_host or SESSION_HOST_FIXTURE in getattr(item, "fixturenames", ()),
            m.e2e or item.get_closest_marker("e2e") is not None,
        )
    return list(found.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The units in start order (with `--no-loadscope-reorder` the lanes take them so)."""
    worker = workerinput(config)
    recorded = read_durations(config.rootpath / COMMITTED_DURATIONS, config.rootpath / DURATIONS)
    lanes = plan(collected_modules(items), recorded.at_nice0(), worker.get("workercount", 1))
    config.stash[PLAN] = lanes
    rank = {u: i for i, u in enumerate(lanes.order)}
    items.sort(key=lambda item: rank[lanes.units[module_of(item.nodeid)]])
    if "lanes_plan_dir" in worker:
        out = Path(worker["lanes_plan_dir"]) / f"{worker['workerid']}.json"
        out.with_suffix(".tmp").write_text(lanes.to_json())
        out.with_suffix(".tmp").replace(out)


def pytest_configure_node(node: Any) -> None:
    node.workerinput["lanes_plan_dir"] = str(plan_dir(node.config))


def collected_plan(config: pytest.Config) -> Plan:
    """The plan one worker wrote (every worker's collection is the same; xdist checks)."""
    return Plan.from_json(next(plan_dir(config).glob("*.json")).read_text())


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.lanes_xdist import WorkUnitScheduling

    return WorkUnitScheduling(config, log, lambda: collected_plan(config))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: its lane's priority (xdist workers only; a plain pytest run
    keeps its own)."""
    if workerinput(item.config):
        lanes = item.config.stash[PLAN]
        unit = lanes.units[module_of(item.nodeid)]
        # Back to 0 needs root (CI is); the critical unit starts first, before any nice.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, 0 if unit == lanes.critical else LANE_NICE)


def cpu_seconds() -> float:
    """This process's CPU and that of its children it has waited for (Ansible, ssh, local
    engines), user and system."""
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


class LaneLog:
    """Every test phase's lane, start, stop, the nice its lane ran it at (as the kernel
    has it: a lane that could not go back to 0 says so) and the CPU seconds the lane spent
    since its last phase (the phase's own, and its children's once reaped: the test hosts'
    are not in it), one JSON line each (a few hundred bytes per test), for DURATIONS and
    benchmarks/suite_lanes.py; emptied when a run starts."""

    def __init__(self, path: Path, worker: str | None) -> None:
        self.path = path
        self.worker = worker
        self.cpu = cpu_seconds()

    def pytest_sessionstart(self) -> None:
        if self.worker is None:
            self.path.unlink(missing_ok=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if worker := self.worker:
            cpu = cpu_seconds()
            line = {
                "worker": worker,
                "nodeid": report.nodeid,
                "when": report.when,
                "start": report.start,
                "stop": report.stop,
                "outcome": report.outcome,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "cpu": round(cpu - self.cpu, 3),
            }
            self.cpu = cpu
            with self.path.open("a") as log:
                log.write(json.dumps(line) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    lane_log = LaneLog(config.rootpath / LANES_LOG, workerinput(config).get("workerid"))
    config.pluginmanager.register(lane_log, "pdstack-lane-log")


def spans_are_modules(config: pytest.Config) -> bool:
    """Whether a lane log's spans are its modules' lengths: each module whole (no -k or -m, no
    test named by its node id) in one lane (`--dist loadscope`; `load` spreads its tests)."""
    option = config.option
    filtered = option.keyword or option.markexpr or any("::" in a for a in config.args)
    return config.getvalue("dist") == "loadscope" and not filtered


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run records its modules' spans (a failed or cut-short one would record what it
    got through)."""
    root = session.config.rootpath
    measured = exitstatus == 0 and spans_are_modules(session.config)
    if not workerinput(session.config) and (root / LANES_LOG).is_file() and measured:
        record_durations(root / LANES_LOG, root / DURATIONS, root)


def pytest_unconfigure(config: pytest.Config) -> None:
    if PLAN_DIR in config.stash:
        shutil.rmtree(config.stash[PLAN_DIR], ignore_errors=True)


if __name__ == "__main__":
    # `make durations`: python -m tests.lanes LOG DURATIONS_FILE, from the repository's root
    import sys

    record_durations(Path(sys.argv[1]), Path(sys.argv[2]), Path.cwd())
