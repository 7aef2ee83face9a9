"""Every systemd unit the roles write: scored by `systemd-analyze security --offline=true`
against the exposure each kind may have (docs/security.md), and validated before it is
installed. The nftables rules of the engine role render to a table nft accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import names, render
from pdctl.escape import systemd_command
from pdctl.spec import load_deployment
from tests.conftest import ROOT, require_tool

ROLES = ROOT / "roles"
DEP_HOST = load_deployment(ROOT / "inventory.ini").hosts[0].name
# Highest exposure allowed per unit (systemd-analyze's 0-10 scale; 7.8 was the old default).
LIMITS = {
    "engine": 4.0,
    "pdstack-gateway.service": 3.0,
    "pdstack-gateway-lease.service": 5.0,  # root (the etcd client key), no capabilities
    "pd-exporter.service": 3.0,
    "pdstack-recover@.service": 5.0,
    names.FINISH_SERVICE: 5.0,  # the same sandbox as recover
    "pdstack-firewall.service": 5.0,
    names.ETCD_UNIT: 3.0,
    names.ETCD_SNAPSHOT_UNIT: 4.0,  # root: it reads the host's client key
}


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The reference deployment's units, rendered with the values the roles' tasks pass."""
    out = tmp_path_factory.mktemp("units")
    dep = load_deployment(ROOT / "inventory.ini")
    files: dict[str, str] = {}
    for inst in dep.instances:
        files[inst.unit] = render.render_instance(inst, dep).unit
    common = {"ansible_managed": render.MANAGED}
    gateway = render.jinja_env(ROLES / "pdstack_gateway" / "templates")
    files[names.GATEWAY_UNIT] = gateway.get_template("gateway.service.j2").render(
        **common,
        command_lines=render.gateway_command_lines(dep, api_key=True),
        register_command=systemd_command(render.register_command(dep.gateways[0].name)),
        api_key_set=True,
        env_file=names.GATEWAY_ENV_FILE,
        state_dir="/var/lib/pdstack-gateway",
        state_name="pdstack-gateway",
        documentation=names.documentation(),
        user="pdstack-gw",
        config_group=names.SERVICE_USER,
    )
    files[names.GATEWAY_LEASE_UNIT] = gateway.get_template("gateway-lease.service.j2").render(
        **common,
        command=systemd_command(render.lease_command(dep.gateways[0].name)),
        gateway_unit=names.GATEWAY_UNIT,
        documentation=names.documentation(),
    )
    engine = render.jinja_env(ROLES / "pdstack_engine" / "templates")
    ops_unit = {"venv": names.VENV, "host": dep.hosts[0].name}
    ops_unit["pending_dir"] = names.RESTART_PENDING_DIR
    files[names.RECOVER_UNIT] = engine.get_template("recover@.service.j2").render(
        **common, **ops_unit
    )
    files[names.FINISH_SERVICE] = engine.get_template("finish.service.j2").render(
        **common, **ops_unit
    )
    files["pdstack-firewall.service"] = engine.get_template("pdstack-firewall.service.j2").render(
        **common, rules_file=f"{names.CONFIG_DIR}/firewall.nft"
    )
    etcd = render.jinja_env(ROLES / "pdstack_etcd" / "templates")
    files[names.ETCD_UNIT] = etcd.get_template("etcd.service.j2").render(
        **common,
        member=dep.etcd[0].name,
        command_lines=render.etcd_command_lines(dep, dep.etcd[0]),
        cluster_token="pdstack-0123456789abcdef",
        cluster_state="new",
        credentials=render.ETCD_CREDENTIAL_FILES,
        user="etcd",
        state_name=Path(names.ETCD_DATA_DIR).name,
        firewall=True,
        rules_file=f"{names.CONFIG_DIR}/etcd-firewall.nft",
        table="pdstack_etcd",
        documentation=names.documentation(),
    )
    files[names.ETCD_SNAPSHOT_UNIT] = etcd.get_template(f"{names.ETCD_SNAPSHOT_UNIT}.j2").render(
        **common,
        script="/usr/local/sbin/pdstack-etcd-snapshot",
        snapshot_dir=names.ETCD_SNAPSHOT_DIR,
        keep=24,
        endpoint="https://127.0.0.1:2379",
        ca=names.ETCD_CA,
        cert=names.ETCD_CLIENT_CERT,
        key=names.ETCD_CLIENT_KEY,
        member_unit=names.ETCD_UNIT,
        documentation=names.documentation(),
    )
    exporter = render.jinja_env(ROLES / "pdstack_exporter" / "templates")
    files["pd-exporter.service"] = exporter.get_template("pd-exporter.service.j2").render(
        **common,
        _pdstack_exporter_user="pdstack-exporter",
        _pdstack_exporter_groups=[names.SERVICE_USER, "systemd-journal"],
        _pdstack_exporter_layout={"venv": names.VENV, "topology_file": names.TOPOLOGY_FILE},
        inventory_hostname=dep.hosts[0].name,
        **yaml.safe_load((ROLES / "pdstack_exporter" / "defaults" / "main.yml").read_text()),
    )
    paths = {}
    for name, text in files.items():
        (out / name).write_text(text)
        paths[name] = out / name
    return paths


def exposure(unit: Path) -> float:
    tool = require_tool("systemd-analyze")
    result = subprocess.run(
        [str(tool), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    return float(match.group(1))


def _limit(name: str) -> float:
    return LIMITS["engine" if name.endswith(("-prefill.service", "-decode.service")) else name]


def test_every_unit_kind_is_scored(units: dict[str, Path]) -> None:
    kinds = {"engine" if n.endswith(("-prefill.service", "-decode.service")) else n for n in units}
    assert kinds == set(LIMITS)


@pytest.mark.parametrize(
    "name",
    ["pdstack-pd0-prefill.service", "pdstack-pd0-decode.service", *list(LIMITS)[1:]],
)
def test_exposure_within_limit(units: dict[str, Path], name: str) -> None:
    score = exposure(units[name])
    print(f"{name}: {score}")
    assert score <= _limit(name), f"{name} scores {score}, above {_limit(name)}"


def test_the_limits_bite(units: dict[str, Path], tmp_path: Path) -> None:
    """Without its hardening block a unit is back above its limit: the score measures them."""
    text = units["pdstack-gateway.service"].read_text()
    bare = tmp_path / "pdstack-gateway.service"
    bare.write_text(re.sub(r"(?ms)^# The gateway needs no device.*?^\n", "\n", text))
    assert "CapabilityBoundingSet" not in bare.read_text()
    assert exposure(bare) > LIMITS["pdstack-gateway.service"]


def test_engines_reach_only_gpu_and_rdma_devices(units: dict[str, Path]) -> None:
    text = units["pdstack-pd0-prefill.service"].read_text()
    allowed = re.findall(r"^DeviceAllow=(\S+) rw$", text, re.M)
    assert "DevicePolicy=closed" in text.splitlines()
    assert allowed and all("nvidia" in d or "infiniband" in d for d in allowed), allowed
    # JIT compilers (Triton, torch.compile) need writable executable memory.
    assert not re.search(r"^MemoryDenyWriteExecute=", text, re.M)


def test_recovery_writes_only_its_own_state_folder(units: dict[str, Path]) -> None:
    """Root without capabilities: its state folder is systemd's, root's alone, and the one
    pdctl recover uses; besides it, only the restart-pending markers a recovery clears."""
    text = units[names.RECOVER_UNIT].read_text().splitlines()
    state = Path(names.RECOVER_STATE).parent
    assert f"StateDirectory={state.relative_to('/var/lib')}" in text
    assert "StateDirectoryMode=0700" in text and "CapabilityBoundingSet=" in text
    writable = [line for line in text if line.startswith("ReadWritePaths=")]
    assert writable == [f"ReadWritePaths=-{names.RESTART_PENDING_DIR}"]


def test_the_finisher_runs_for_its_host_as_its_timer_says(units: dict[str, Path]) -> None:
    """pdctl finish for this host's pairs, every interval after its last run ended, with the
    recovery's sandbox (it runs the same coordinated restart)."""
    service = units[names.FINISH_SERVICE].read_text().splitlines()
    recover = units[names.RECOVER_UNIT].read_text().splitlines()
    assert f"ExecStart={names.VENV}/bin/pdctl finish --host {DEP_HOST}" in service
    sandbox = [line for line in recover if "=" in line and not line.startswith("#")]
    own = (
        "Description=",
        "ExecStart=",
        "SyslogIdentifier=",
        "Restart",
        "State",
        "StartLimit",
        "Not",
    )
    shared = [line for line in sandbox if not line.startswith(own)]
    assert shared and set(shared) <= set(service)
    engine = render.jinja_env(ROLES / "pdstack_engine" / "templates")
    timer = engine.get_template("finish.timer.j2").render(ansible_managed="m", interval_s=30)
    assert {"OnActiveSec=30s", "OnUnitInactiveSec=30s", "WantedBy=timers.target"} <= set(
        timer.splitlines()
    )


def test_the_gateway_lease_lives_and_ends_with_its_gateway(units: dict[str, Path]) -> None:
    """Root without capabilities (it reads the host's etcd client key); stopped with the
    gateway (its key revoked), started with it."""
    text = units[names.GATEWAY_LEASE_UNIT].read_text().splitlines()
    assert f"BindsTo={names.GATEWAY_UNIT}" in text and f"WantedBy={names.GATEWAY_UNIT}" in text
    assert "CapabilityBoundingSet=" in text and not [t for t in text if t.startswith("User=")]
    assert any(line.startswith("ExecStart=") and " gateway heartbeat " in line for line in text)


def test_gateway_runs_as_its_own_user(units: dict[str, Path]) -> None:
    gateway = units["pdstack-gateway.service"].read_text()
    engine = units["pdstack-pd0-decode.service"].read_text()
    user = re.compile(r"^User=(\S+)$", re.M)
    g, e = user.search(gateway), user.search(engine)
    assert g and e and g.group(1) != e.group(1)
    # Engines cannot see the gateway's processes (its argv holds the key).
    assert "ProtectProc=invisible" in engine.splitlines()


def _unit_tasks() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for tasks in sorted(ROLES.glob("*/tasks/*.yml")):
        for task in yaml.safe_load(tasks.read_text()) or []:
            args = task.get("ansible.builtin.template") or task.get("ansible.builtin.copy")
            if args and ".unit_dir }}/" in str(args.get("dest", "")):
                found.append((tasks, task))
    return found


def test_every_unit_file_a_role_writes_is_validated() -> None:
    tasks = _unit_tasks()
    names = {t["name"] for _, t in tasks}
    # Engines, pair targets, recovery, the finish service and timer, firewall, gateway, fleet
    # restart lock, pd-exporter, the store's member and its snapshot service and timer.
    assert len(tasks) == 10, names
    for path, task in tasks:
        args = task.get("ansible.builtin.template") or task.get("ansible.builtin.copy")
        assert "pdstack_unit_verify" in str(args.get("validate", "")), f"{path}: {task['name']}"


def _firewall_tasks(out: Path) -> list[dict[str, Any]]:
    """The role's own tasks that resolve the sources and write the rules, writing to `out`."""
    tasks = yaml.safe_load((ROLES / "pdstack_engine" / "tasks" / "firewall.yml").read_text())
    picked = [
        t for t in tasks if "firewall's host names" in t["name"] or "every host name" in t["name"]
    ]
    (write,) = [t for t in tasks if t["name"] == "Write the firewall rules"]
    args = dict(write["ansible.builtin.template"], dest=str(out))
    args["src"] = str(ROLES / "pdstack_engine" / "templates" / args["src"])
    del args["validate"], args["owner"], args["group"]  # nft -c below; no root needed
    vars_ = dict(write["vars"], ports=[30000, 30001, 8998])
    return [*picked, {"ansible.builtin.template": args, "vars": vars_}]


def _converge_firewall(tmp_path: Path, inventory: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "hosts.ini").write_text(inventory)
    role = ROLES / "pdstack_engine"
    play = {
        "hosts": "gpu1",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(role / "vars" / "main.yml")],
        "vars": {
            **yaml.safe_load((role / "defaults" / "main.yml").read_text()),
            "pdstack_engine_firewall_allow": ["192.0.2.0/24", "2001:db8::/32"],
        },
        "tasks": _firewall_tasks(tmp_path / "firewall.nft"),
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    return subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
            str(tmp_path / "play.yml"), "-e", f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip


def test_firewall_rules_render_to_a_table_nft_accepts(tmp_path: Path) -> None:
    """Through Ansible, with the role's own tasks and variables: sources from every inventory
    group, names resolved to addresses on the host (here `localhost`)."""
    result = _converge_firewall(
        tmp_path,
        "[pd_hosts]\ngpu1 ansible_host=10.0.0.11\ngpu2 ansible_host=10.0.0.12\n"
        "[router]\ngw ansible_host=10.0.0.2\n[monitoring]\nlocalhost\n",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    text = (tmp_path / "firewall.nft").read_text()
    elements = dict(re.findall(r"set (\w+) \{.*?elements = \{ (.*?) \}", text, re.S))
    assert elements["engine_ports"] == "30000, 30001, 8998"
    assert set(elements["allowed4"].split(", ")) == {
        "10.0.0.11", "10.0.0.12", "10.0.0.2", "127.0.0.1", "192.0.2.0/24",
    }  # fmt: skip
    assert "2001:db8::/32" in elements["allowed6"].split(", ")
    # Only TCP to the engine ports reaches the source check and its reject.
    hook, check_chain = text.split("chain input", 1)[1].split("chain engines", 1)
    assert re.findall(r"^\t\t(\S.*)$", hook, re.M)[1:] == ["tcp dport @engine_ports jump engines"]
    assert check_chain.rstrip().splitlines()[-3].strip() == "counter reject with tcp reset"
    check = subprocess.run(
        [str(require_tool("nft")), "-c", "-f", str(tmp_path / "firewall.nft")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr


def test_firewall_refuses_a_name_that_does_not_resolve(tmp_path: Path) -> None:
    result = _converge_firewall(
        tmp_path,
        "[pd_hosts]\ngpu1 ansible_host=10.0.0.11\n[router]\nno-such-host.invalid\n",
    )
    assert result.returncode != 0
    assert "no-such-host.invalid do not resolve on gpu1" in result.stdout
    assert not (tmp_path / "firewall.nft").exists()
