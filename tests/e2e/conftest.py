"""The systemd test host for end-to-end tests (deploy/testhost/testhost, docs/testhost.md).

Fixtures:
- ``testhost`` (session): one booted Debian systemd host. Started with ``testhost up`` and
  torn down with ``testhost down`` at the end of the session. With ``PDSTACK_TESTHOST_REUSE=1``
  an already running host of the same name is used as it is and left running.
- ``testhost_factory`` (module): ``testhost_factory(name, init="systemd")`` starts further
  hosts (e.g. ``init="none"``, a host without systemd, for the preflight tests); each is torn
  down at the end of its module unless the test did it itself with ``host.down()``, so its
  engines and gateway do not run on through the other modules.
- ``fleet`` (module): two hosts on one bridge with one inventory (``testhost fleet-up``),
  taken down with ``fleet-down`` at the end of the module.

Environment: ``PDSTACK_TESTHOST_NAME`` (default ``pde2e``), ``PDSTACK_TESTHOST_REUSE=1``,
``PDSTACK_TESTHOST_KEEP=1`` (leave the session's host and fleet running after the tests),
``PDSTACK_FLEET_NAME`` (default ``pdfl``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTHOST = ROOT / "deploy" / "testhost" / "testhost"
STATE = Path(os.environ.get("PDSTACK_TESTHOST_STATE", ROOT / "deploy" / "testhost" / "state"))
RUN = Path(os.environ.get("PDSTACK_TESTHOST_RUN", "/run/pdstack-testhost"))

# A cold build of the root (debootstrap, once per machine and package list) takes 1-3 minutes;
# it happens inside the first e2e test's fixture set-up, so e2e tests get a longer timeout.
E2E_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


def _unavailable(message: str) -> None:
    """Missing prerequisites skip a local run but fail CI (same rule as tests/conftest.py)."""
    message += "; see docs/testhost.md (as root: scripts/setup.sh)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        _unavailable("the systemd test host needs root (debootstrap, systemd-nspawn, veth)")
    for tool in ("debootstrap", "systemd-nspawn", "ip", "ssh", "nsenter"):
        if not shutil.which(tool):
            _unavailable(f"{tool} not found")


def _ansible_bin(name: str) -> str:
    venv = ROOT / ".venv" / "bin" / name
    found = str(venv) if venv.exists() else shutil.which(name)
    if not found:
        _unavailable(f"{name} not found (the project venv provides ansible-core)")
    return str(found)


def run_ansible(
    tool: str, inventory: Path, args: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``TOOL -i INVENTORY ARGS...`` run from the repository root, output captured."""
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [_ansible_bin(tool), "-i", str(inventory), *args],
        cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_testhost(*args: str, timeout: float = 960) -> subprocess.CompletedProcess[str]:
    """Run deploy/testhost/testhost; its progress lines go to stderr (shown on failure)."""
    return subprocess.run(
        [str(TESTHOST), *args], text=True, capture_output=True, timeout=timeout, check=False
    )


@dataclass
class TestHost:
    """A running test host. ``address`` is the host's own IP; its services are reachable from
    the controller at ``http://{address}:{port}`` (see ``url``)."""

    __test__ = False  # not a test class

    name: str
    address: str
    controller_address: str
    inventory: Path
    key: Path
    known_hosts: Path
    init: str = "systemd"
    reused: bool = False
    _down: bool = field(default=False, repr=False)

    def ssh_argv(self, cmd: str) -> list[str]:
        return [
            "ssh", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5", "-o", "LogLevel=ERROR",
            "-o", "ControlMaster=no", "-o", "ControlPath=none",
            f"root@{self.address}", "--", cmd,
        ]  # fmt: skip

    def ssh(
        self, cmd: str, *, check: bool = False, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` (a shell command line) as root on the host; text output captured."""
        return subprocess.run(
            self.ssh_argv(cmd), text=True, capture_output=True, timeout=timeout, check=check,
            input=input,
        )  # fmt: skip

    def ansible(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``ansible -i <inventory> ARGS...`` (e.g. ``host.ansible("all", "-m", "ping")``)."""
        return run_ansible("ansible", self.inventory, args, timeout)

    def ansible_playbook(
        self, *args: str, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """``ansible-playbook -i <inventory> ARGS...`` run from the repository root."""
        return run_ansible("ansible-playbook", self.inventory, args, timeout)

    def url(self, port: int, path: str = "") -> str:
        return f"http://{self.address}:{port}{path}"

    @property
    def leader_pid(self) -> int | None:
        """The host's PID 1 as seen from the controller (None once down)."""
        try:
            return int((RUN / self.name / "leader.pid").read_text())
        except (OSError, ValueError):
            return None

    @property
    def link(self) -> str:
        """The controller side of the host's veth pair."""
        return f"ve-{self.name}"

    def down(self) -> subprocess.CompletedProcess[str]:
        result = run_testhost("down", "--name", self.name, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"testhost down --name {self.name} failed:\n{result.stderr}")
        self._down = True
        return result


def _is_up(name: str) -> bool:
    return run_testhost("status", "--name", name, timeout=60).returncode == 0


def _load(name: str, *, reused: bool = False) -> TestHost:
    rd = RUN / name
    sd = STATE / name
    return TestHost(
        name=name,
        address=(rd / "address").read_text().strip(),
        controller_address=(rd / "host_address").read_text().strip(),
        inventory=sd / "inventory.ini",
        key=sd / "id_ed25519",
        known_hosts=sd / "known_hosts",
        init=(rd / "init").read_text().strip(),
        reused=reused,
    )


def start_testhost(name: str, init: str = "systemd", *, reuse: bool = False) -> TestHost:
    """Boot test host ``name`` (a fresh copy of the cached root) and return it."""
    _check_prerequisites()
    if reuse and _is_up(name):
        host = _load(name, reused=True)
        if host.init != init:
            pytest.fail(f"test host {name} is up with init {host.init}, not {init}; take it down")
        return host
    # A host of this name left over by an interrupted session is replaced (down is idempotent).
    cleared = run_testhost("down", "--name", name, timeout=120)
    if cleared.returncode != 0:
        pytest.fail(f"testhost down --name {name} failed:\n{cleared.stderr[-4000:]}")
    result = run_testhost("up", "--name", name, "--init", init)
    if result.returncode != 0:
        pytest.fail(
            f"testhost up --name {name} --init {init} failed (exit {result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )
    return _load(name)


@pytest.fixture(scope="session")
def testhost() -> Iterator[TestHost]:
    name = os.environ.get("PDSTACK_TESTHOST_NAME", "pde2e")
    host = start_testhost(name, reuse=os.environ.get("PDSTACK_TESTHOST_REUSE") == "1")
    yield host
    if not host.reused and not host._down and os.environ.get("PDSTACK_TESTHOST_KEEP") != "1":
        host.down()


@pytest.fixture(scope="module")
def testhost_factory() -> Iterator[Callable[..., TestHost]]:
    started: list[TestHost] = []

    def make(name: str, init: str = "systemd") -> TestHost:
        host = start_testhost(name, init)
        started.append(host)
        return host

    yield make
    errors = []
    for host in started:
        if not host._down:
            try:
                host.down()
            except RuntimeError as exc:
                errors.append(str(exc))
    if errors:
        pytest.fail("\n".join(errors))


@dataclass
class TestFleet:
    """Test hosts NAME1..NAMEn on one bridge (``testhost fleet-up``) with one inventory:
    [pd_hosts] all, [router] the first two, [monitoring] the first, [etcd] all (n odd).
    ``ssh_config`` reaches them all (``ssh -F``, ``PDCTL_SSH_CONFIG``)."""

    __test__ = False

    name: str
    hosts: list[TestHost]
    inventory: Path
    ssh_config: Path
    seconds: float  # fleet-up's wall time

    def ansible_playbook(
        self, *args: str, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return run_ansible("ansible-playbook", self.inventory, args, timeout)

    def down(self) -> None:
        result = run_testhost("fleet-down", "--fleet", self.name, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"testhost fleet-down --fleet {self.name} failed:\n{result.stderr}")


def start_fleet(name: str, size: int = 2) -> TestFleet:
    """Boot fleet ``name`` (fresh hosts; a fleet left by an interrupted session is replaced)."""
    _check_prerequisites()
    cleared = run_testhost("fleet-down", "--fleet", name, timeout=300)
    if cleared.returncode != 0:
        pytest.fail(f"testhost fleet-down --fleet {name} failed:\n{cleared.stderr[-4000:]}")
    start = time.monotonic()
    result = run_testhost("fleet-up", "--fleet", name, "--size", str(size))
    if result.returncode != 0:
        pytest.fail(f"testhost fleet-up --fleet {name} failed:\n{result.stderr[-4000:]}")
    return TestFleet(
        name=name,
        hosts=[_load(f"{name}{i}") for i in range(1, size + 1)],
        inventory=STATE / name / "inventory.ini",
        ssh_config=STATE / name / "ssh_config",
        seconds=time.monotonic() - start,
    )


# Per module: its 12 engines, 2 gateways and 3 etcd members do not keep running through the
# other tests. Three hosts: the store's HA layout (a member on each).
@pytest.fixture(scope="module")
def fleet() -> Iterator[TestFleet]:
    yield from _module_fleet("")


# test_fleet_groups.py's own fleet, so that it runs in a lane beside test_fleet.py's.
@pytest.fixture(scope="module")
def groups_fleet() -> Iterator[TestFleet]:
    yield from _module_fleet("g")


def _module_fleet(suffix: str) -> Iterator[TestFleet]:
    f = start_fleet(os.environ.get("PDSTACK_FLEET_NAME", "pdfl") + suffix, size=3)
    yield f
    if os.environ.get("PDSTACK_TESTHOST_KEEP") != "1":
        f.down()
