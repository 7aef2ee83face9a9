"""Shared test helpers: locating the real parts the tests run against."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from pdctl.spec import Role
from pdctl.topology import (
    Topology,
    TopologyCoord,
    TopologyGateway,
    TopologyInstance,
    TopologyPair,
)

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PDSTACK_CACHE", "/var/cache/pdstack"))

# The modules that use the session's one systemd test host (the `testhost` fixture of
# tests/e2e/conftest.py, or `site` on it): in `make test`'s lanes they are one unit of work,
# run in one worker one after another. A module that takes one of these fixtures and is not
# listed stops the run (see pytest_collection_modifyitems).
SESSION_HOST_MODULES = frozenset(
    {"tests/e2e/test_site.py", "tests/e2e/test_site_security.py", "tests/e2e/test_testhost.py"}
)
SESSION_HOST_FIXTURES = frozenset({"testhost", "site"})


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The unit of work of a test for `pytest -n N --dist loadscope`: its module, so that its
    module fixtures (a converged host, a live stack) are set up once, or the session host."""
    module = module_of(nodeid)
    return "session-host" if module in SESSION_HOST_MODULES else module


# The longest modules that are not e2e, longest first (their spans in `make test`'s lanes,
# 2026-12-06). They go right after the e2e units: started in collection order,
# test_ops_restart.py (4 minutes) began after the unit tests and ran alone for the last 2-3
# minutes of the suite. A module missing here only runs later; the list is no assertion.
LONG_MODULES = (
    "tests/integration/test_ops_restart.py",
    # e2e-marked (it converges a test host): it starts with the e2e units, and binds late.
    "tests/integration/test_monitoring_e2e.py",
    "tests/integration/test_monitoring_gateway.py",
    "tests/integration/test_monitoring_live.py",
    "tests/integration/test_sim_gateway.py",
    "tests/integration/test_monitoring_preview.py",
    "tests/integration/test_gateway_register.py",
    # ansible-lint alone takes 20-25 s: the longest of the unit modules (make unit, make check).
    "tests/unit/test_ansible_lint.py",
)


# The critical lane: the fleet module's chain of converges, rolls and faults is the longest
# unit of work (about 15 minutes on 2 busy cores; the next is about 10), and the suite waits
# for it alone at its end. In `make test`'s lanes every other unit runs at a lower CPU
# priority (nice LANE_NICE), it and its children (Ansible, ssh, the test hosts it starts), so
# that the longest lane gets the CPU it waits for and the others fill what it leaves. A lane
# gets less CPU, never a shorter wait: the tests wait for events, bounded.
CRITICAL_MODULES = frozenset({"tests/e2e/test_fleet.py"})
LANE_NICE = 5


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: its lane's priority (xdist workers only; a plain pytest run
    keeps its own)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        nice = 0 if module_of(item.nodeid) in CRITICAL_MODULES else LANE_NICE
        # Back to 0 needs root (CI is); the critical module starts first, before any nice.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)


# Every test phase's lane (xdist worker), start and stop, one JSON line each, for
# benchmarks/suite_lanes.py: which lane ends last, and what it ran. Written by the workers of
# every lane run (a few hundred bytes per test), emptied when a run starts.
LANES_LOG = ROOT / ".lanes.jsonl"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        LANES_LOG.unlink(missing_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if worker := os.environ.get("PYTEST_XDIST_WORKER"):
        line = {"worker": worker, "nodeid": report.nodeid, "when": report.when,
                "start": report.start, "stop": report.stop, "outcome": report.outcome}  # fmt: skip
        with LANES_LOG.open("a") as log:
            log.write(json.dumps(line) + "\n")


def long_unit(unit: str) -> bool:
    """A unit of work of minutes (e2e or LONG_MODULES), told by its name alone: the scheduler
    runs in the xdist controller, which sees node ids, not markers."""
    return unit == "session-host" or unit.startswith("tests/e2e/") or unit in LONG_MODULES


def next_unit(pending: list[str], queue: list[str]) -> str:
    """The unit a lane binds next, from the queue's units in order. xdist binds it when the
    lane has 2 tests or fewer pending (a one-test unit binds its successor as it starts):
    minutes before a long unit's last tests end. So behind a long unit goes the first short
    one, and a long unit is bound only behind short work, when its lane is nearly free (two
    long units in one lane while the others ran dry made a 75 s tail)."""
    if any(long_unit(u) for u in pending):
        return next((u for u in queue if not long_unit(u)), queue[0])
    return queue[0]


def start_order(item: pytest.Item) -> tuple[int, int]:
    module = module_of(item.nodeid)
    if item.get_closest_marker("e2e") is not None:
        return (0, 0)
    if module in LONG_MODULES:
        return (1, LONG_MODULES.index(module))
    return (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e tests go first, then the long modules, longest first (with
    `--no-loadscope-reorder`, the units run in this order: the fleet first), so the workers
    that wait on test hosts start at once, no long module is left for the end, and the short
    modules fill the other lanes. (The sort is stable: file order within each.)"""
    items.sort(key=start_order)
    for listed, modules in (("LONG_MODULES", LONG_MODULES), ("CRITICAL_MODULES", CRITICAL_MODULES)):
        if gone := sorted(m for m in modules if not (ROOT / m).is_file()):
            raise pytest.UsageError(f"{listed} in {__file__} names modules that are gone: {gone}")
    strays = {
        module_of(item.nodeid)
        for item in items
        if SESSION_HOST_FIXTURES & set(getattr(item, "fixturenames", ()))
    } - SESSION_HOST_MODULES
    if strays:
        raise pytest.UsageError(f"add {sorted(strays)} to SESSION_HOST_MODULES in {__file__}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` by work_unit instead of by module or class. (xdist's loadgroup
    marks nodeids, which pytest 9.2's node ids no longer let it do.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            pending = [
                u for u, tests in self.assigned_work[node].items() if not all(tests.values())
            ]
            self.workqueue.move_to_end(next_unit(pending, list(self.workqueue)), last=False)
            super()._assign_work_unit(node)

    return WorkUnitScheduling(config, log)


def filter_plugin() -> ModuleType:
    """filter_plugins/pdstack.py, the roles' view of the deployment (not a package)."""
    spec = importlib.util.spec_from_file_location(
        "pdstack_filters", ROOT / "filter_plugins" / "pdstack.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py (scripts, not a package) as a module, registered in sys.modules so
    that its dataclasses can look their module up."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run_pdctl(*args: str, input: str | None = None) -> Run:
    """The real entry point in-process, `input` on stdin: `Error: …` on stderr and the exit
    codes a shell sees, which CliRunner.invoke on the group would not show."""
    from pdctl.cli import main

    runner = CliRunner()
    with runner.isolation(input=input) as (out, err, _), pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["pdctl", *args])
        mp.setenv("COLUMNS", "200")
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return Run(code, out.getvalue().decode(), err.getvalue().decode())


def role_expression(
    tmp_path: Path, vars_file: Path, facts: dict[str, Any], expr: str, inventory: str = ""
) -> Any:
    """`{{ expr }}` as real Ansible evaluates it on localhost with a role's vars file and
    `facts` (registered results as the role's tasks produce them), read back as JSON.
    `inventory`: an INI inventory holding localhost, for expressions that read its groups."""
    playbook = ROOT / ".venv" / "bin" / "ansible-playbook"
    if not playbook.exists():
        pytest.skip(f"{playbook} not found; run scripts/setup.sh")
    out = tmp_path / "out.json"
    task = {"dest": str(out), "content": f"{{{{ {expr} | to_json }}}}", "mode": "0644"}
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(vars_file)],
            "tasks": [{"ansible.builtin.copy": task}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    facts = {**facts, "ansible_python_interpreter": sys.executable}
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    hosts = "localhost,"
    if inventory:
        (tmp_path / "hosts.ini").write_text(inventory)
        hosts = str(tmp_path / "hosts.ini")
    env = dict(
        os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false"
    )
    r = subprocess.run(
        [str(playbook), "-i", hosts, "-c", "local", str(tmp_path / "play.yml"),
         "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=ROOT, env=env, text=True, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def require_path(path: Path | str | None, what: str) -> Path:
    """A missing real part skips a local run but fails CI, where scripts/setup.sh provides it."""
    if path and Path(path).exists():
        return Path(path)
    message = f"{what} not found ({path}); run scripts/setup.sh"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str) -> Path:
    found = shutil.which(name) or str(ROOT / ".venv" / "bin" / name)
    return require_path(found, name)


TWO_HOSTS = ROOT / "deploy" / "examples" / "two-hosts.ini"


def two_gateways_inventory(tmp_path: Path) -> Path:
    """deploy/examples/two-hosts.ini with both hosts in [router]: two gateways."""
    text = TWO_HOSTS.read_text()
    assert "[router]\ngpu-node-1\n\n" in text
    text = text.replace("[router]\ngpu-node-1\n", "[router]\ngpu-node-1\ngpu-node-2\n")
    text = text.replace("=../profiles/", f"={ROOT}/deploy/profiles/")
    path = tmp_path / "two-gateways.ini"
    path.write_text(text)
    return path


def one_pair_topology(
    host: str,
    prefill_url: str,
    decode_url: str,
    *,
    bootstrap_port: int,
    gateway_url: str,
    metrics_url: str,
    prefill_gpus: tuple[int, ...] = (0,),
    decode_gpus: tuple[int, ...] = (1,),
) -> Topology:
    """The topology file of one pair pd0 (prefill on NUMA 0, decode on NUMA 1) and a gateway."""

    def inst(role: Role, url: str, numa: int, gpus: tuple[int, ...]) -> TopologyInstance:
        name = f"pd0-{role.value}"
        return TopologyInstance(
            id=f"{host}/{name}",
            host=host,
            name=name,
            pair="pd0",
            role=role,
            unit=f"pdstack-{name}.service",
            url=url,
            numa_node=numa,
            gpus=list(gpus),
            bootstrap_port=bootstrap_port if role is Role.PREFILL else None,
        )

    return Topology(
        model="sim",
        engine="sim",
        instances=[
            inst(Role.PREFILL, prefill_url, 0, prefill_gpus),
            inst(Role.DECODE, decode_url, 1, decode_gpus),
        ],
        pairs=[
            TopologyPair(
                host=host,
                name="pd0",
                target="pdstack-pd0.target",
                prefill=f"{host}/pd0-prefill",
                decode=f"{host}/pd0-decode",
            )
        ],
        gateways=[
            TopologyGateway(
                host=host, url=gateway_url, metrics_url=metrics_url, unit="pdstack-gateway.service"
            )
        ],
    )


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TopologyCoord]:
    """A real one-member etcd for this worker's tests (pdctl.testing.etcd)."""
    from pdctl.testing.etcd import local_etcd

    with local_etcd(tmp_path_factory.mktemp("etcd")) as etcd:
        yield etcd.coord


@pytest.fixture
def etcd_coord(etcd_server: TopologyCoord, monkeypatch: pytest.MonkeyPatch) -> TopologyCoord:
    """The session's etcd under a key prefix of this test's own (an empty store), which
    pdctl's ops commands use instead of the topology's store (PDCTL_ETCD_ENDPOINTS/_PREFIX)."""
    from pdctl.ops.context import ETCD_ENDPOINTS_ENV, ETCD_PREFIX_ENV

    c = etcd_server.model_copy(update={"prefix": f"/pdstack-test-{uuid.uuid4().hex[:12]}/"})
    monkeypatch.setenv(ETCD_ENDPOINTS_ENV, ",".join(c.endpoints))
    monkeypatch.setenv(ETCD_PREFIX_ENV, c.prefix)
    return c
