"""Shared test helpers: locating the real parts the tests run against."""

from __future__ import annotations

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

# `make test`'s lanes: work units, their order and priorities, derived from the collection and
# the previous run's durations.
pytest_plugins = ["tests.lanes"]


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
