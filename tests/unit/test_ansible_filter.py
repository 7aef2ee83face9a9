"""filter_plugins/pdstack.py: what the roles template, for the shipped and example inventories."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl.lint import Severity, lint
from pdctl.render import render_instance, router_args
from pdctl.spec import load_deployment
from tests.conftest import filter_plugin, two_gateways_inventory

ROOT = Path(__file__).resolve().parents[2]
TWO_HOSTS = ROOT / "deploy" / "examples" / "two-hosts.ini"
REFERENCE = ROOT / "deploy" / "profiles" / "reference.yml"


filters = filter_plugin()


def test_two_hosts_validate_clean() -> None:
    dep = load_deployment(TWO_HOSTS)
    errors = [f for f in lint(dep) if f.severity is Severity.ERROR]
    assert errors == []
    assert [h.name for h in dep.hosts] == ["gpu-node-1", "gpu-node-2"]


def test_two_hosts_every_host_its_own_pairs() -> None:
    data = filters.pdstack_deployment(str(TWO_HOSTS), "../profiles/reference.yml")
    for name, address in (("gpu-node-1", "10.0.0.11"), ("gpu-node-2", "10.0.0.12")):
        host = data["hosts"][name]
        assert [p["target"] for p in host["pairs"]] == ["pdstack-pd0.target"]
        assert {i["inst"]["id"] for i in host["instances"]} == {
            f"{name}/pd0-prefill",
            f"{name}/pd0-decode",
        }
        # Engines bind the host's own address (the bootstrap server too: decodes reach it there).
        for inst in host["instances"]:
            assert f"--host {address}" in inst["command_lines"]
            assert inst["env"]["CUDA_VISIBLE_DEVICES"] in ("0,1,2,3", "4,5,6,7")
        assert host["gpus"] == list(range(8)) and host["numa_nodes"] == [0, 1]


def test_two_hosts_one_gateway_over_all_pairs() -> None:
    data = filters.pdstack_deployment(str(TWO_HOSTS), "../profiles/reference.yml")
    gateway = data["gateway"]
    assert gateway["url"] == "http://10.0.0.11:8000"
    assert gateway["urls"] == {"gpu-node-1": "http://10.0.0.11:8000"}
    lines = gateway["command_lines"]
    assert lines[0] == "/opt/pdstack/venv/bin/smg launch"
    assert lines.count("--pd-disaggregation") == 1
    # No worker on smg's command line (it could not carry a pairing protocol): the unit's
    # ExecStartPost= registers both pairs, bound.
    assert [line for line in lines if line.startswith(("--prefill", "--decode"))] == []
    assert gateway["register"] == {
        "gpu-node-1": "/opt/pdstack/venv/bin/pdctl gateway register --gateway gpu-node-1 "
        "--timeout 60"
    }
    # The same tokens `pdctl render` prints: one source of gateway flags.
    dep = load_deployment(TWO_HOSTS)
    assert shlex.split(" ".join(lines))[1:] == router_args(dep)
    # With a key: one more line, the variable systemd fills from the gateway's env file.
    assert gateway["command_lines_api_key"] == [*lines, "--api-key ${PDSTACK_GATEWAY_API_KEY}"]
    assert gateway["env_file"] == "/etc/pdstack/gateway.env"
    # Per gateway host its liveness key in etcd.
    assert gateway["lease"] == {
        "unit": "pdstack-gateway-lease.service",
        "command": {
            "gpu-node-1": "/opt/pdstack/venv/bin/pdctl gateway heartbeat --gateway gpu-node-1"
        },
    }


def test_stale_pairs_filter_keeps_the_hosts_pairs() -> None:
    data = filters.pdstack_deployment(str(TWO_HOSTS), "../profiles/reference.yml")
    keep = [p["pair"] for p in data["hosts"]["gpu-node-1"]["pairs"]]
    found = ["pdstack-pd0.target", "pdstack-pd0-decode.service", "pdstack-pd9-decode.service"]
    stale = filters.pdstack_stale_pairs(found, keep)
    assert stale["pairs"] == ["pd9"] and stale["stop"] == ["pdstack-pd9-decode.service"]


def test_profile_path_resolves_like_pdctl() -> None:
    assert filters.pdstack_profile_path(str(TWO_HOSTS), "../profiles/reference.yml") == str(
        TWO_HOSTS.parent / "../profiles/reference.yml"
    )
    assert filters.pdstack_profile_path(str(TWO_HOSTS), "/abs/p.yml") == "/abs/p.yml"


def test_unit_context_is_the_renderers() -> None:
    dep = load_deployment(TWO_HOSTS)
    data = filters.pdstack_deployment(str(TWO_HOSTS), str(REFERENCE))
    for inst in dep.instances:
        ctx = next(i for i in data["hosts"][inst.host]["instances"] if i["inst"]["id"] == inst.id)
        rendered = render_instance(inst, dep)
        assert ctx["command"] == rendered.command
        assert ctx["env"] == rendered.environment
        assert ctx["env_file"] == rendered.env_file


def test_packages_per_engine_kind() -> None:
    ref = filters.pdstack_deployment(str(ROOT / "inventory.ini"), str(REFERENCE))["packages"]
    assert ref == {
        "engine": {"deps": ["sglang==0.5.23", "nixl-cu12==1.5.1", "pdctl"], "no_deps": []},
        "gateway": {"deps": ["smg==1.13.0", "pdctl"], "no_deps": []},
    }
    sim = filters.pdstack_deployment(str(ROOT / "inventory.ini"), "deploy/profiles/sim.yml")
    # The sim's NIXL: the controller venv's pin (requirements/nixl-sim.txt), without torch/CUDA.
    assert sim["packages"]["engine"] == {"deps": ["pdctl"], "no_deps": ["nixl-cu12==1.5.1"]}
    assert sim["wheelhouse_args"] == ["smg==1.13.0", "--no-deps", "nixl-cu12==1.5.1"]
    assert filters.SIM_NIXL_REQUIREMENTS.read_text().count("nixl-cu12==1.5.1") == 1


def test_sim_without_nixl_backend_installs_no_nixl(tmp_path: Path) -> None:
    profile = tmp_path / "sim-fake.yml"
    sim = (ROOT / "deploy/profiles/sim.yml").read_text()
    profile.write_text(sim.replace("transfer_backend: nixl", "transfer_backend: fake"))
    data = filters.pdstack_deployment(str(ROOT / "inventory.ini"), str(profile))
    assert data["packages"]["engine"] == {"deps": ["pdctl"], "no_deps": []}
    assert data["wheelhouse_args"] == ["smg==1.13.0"]


def test_bad_profile_is_an_ansible_error(tmp_path: Path) -> None:
    from ansible.errors import AnsibleFilterError

    bad = tmp_path / "bad.yml"
    bad.write_text("model: [\n")
    with pytest.raises(AnsibleFilterError, match="malformed YAML"):
        filters.pdstack_deployment(str(TWO_HOSTS), str(bad))


def test_validate_filter_is_pdctl_validate_in_process(tmp_path: Path) -> None:
    """site.yml's preflight stops on what `pdctl validate` would print, and names that command."""
    sim = ROOT / "deploy/profiles/sim.yml"
    ok = filters.pdstack_validate(str(ROOT / "inventory.ini"), str(sim))
    assert ok["rc"] == 0 and ok["stdout"].startswith("OK: no findings"), ok
    argv = shlex.split(ok["command"])
    assert argv[0].endswith("/pdctl") and argv[1:] == [
        "validate", "-i", str(ROOT / "inventory.ini"), "-p", str(sim)
    ]  # fmt: skip
    overlap = tmp_path / "overlap.yml"
    overlap.write_text(sim.read_text().replace("gpus: [1]", "gpus: [0]"))
    bad = filters.pdstack_validate(str(ROOT / "inventory.ini"), str(overlap), True)
    assert bad["rc"] == 2 and "gpu-overlap" in bad["stdout"], bad
    assert "errors: 1, warnings: 0" in bad["stdout"] and bad["command"].endswith(" --strict")
    unreadable = tmp_path / "broken.yml"
    unreadable.write_text("model: [\n")
    broken = filters.pdstack_validate(str(ROOT / "inventory.ini"), str(unreadable))
    assert broken["rc"] == 2 and broken["stdout"].startswith("Error: "), broken
    assert "YAML" in broken["stdout"]


def test_the_plugin_imports_no_cli_and_leaves_sys_path_alone(tmp_path: Path) -> None:
    """Ansible's Python gets the validation and the alert rules from their own modules: no
    pdctl.cli, and no checkout folder on sys.path (tests, deploy, … would become importable)."""
    # The checkout's pdctl, as an installed package: the checkout itself is not on sys.path.
    site = tmp_path / "site"
    site.mkdir()
    (site / "pdctl").symlink_to(ROOT / "pdctl")
    plugin, inventory = ROOT / "filter_plugins/pdstack.py", ROOT / "inventory.ini"
    code = f"""
import importlib.util, json, sys
before = list(sys.path)
spec = importlib.util.spec_from_file_location("f", {str(plugin)!r})
f = importlib.util.module_from_spec(spec)
spec.loader.exec_module(f)
rc = f.pdstack_validate({str(inventory)!r}, {str(ROOT / "deploy/profiles/sim.yml")!r})["rc"]
rules = f.pdstack_monitoring_rules({{}})
cli = sorted(m for m in sys.modules if m.startswith("pdctl.cli"))
print(json.dumps([rc, "groups:" in rules, cli, sys.path == before]))
"""
    paths = [str(site), *(p for p in sys.path if p and Path(p).resolve() != ROOT)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # cwd: not the checkout, which `python -c` would put first on sys.path.
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, True, [], True]


def test_unit_verify_command_runs_systemd_analyze_on_the_unit_name() -> None:
    cmd = filters.pdstack_unit_verify("pdstack-pd0.target")
    assert cmd.endswith(" %s")
    # Ansible substitutes the temporary file for %s and splits with shlex (no shell).
    argv = shlex.split(cmd % "/tmp/ansible-tmp/source")
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == [
        "pdstack-pd0.target",
        "/tmp/ansible-tmp/source",
    ]


def test_every_router_host_gets_a_gateway_and_its_own_register_line(tmp_path: Path) -> None:
    data = filters.pdstack_deployment(str(two_gateways_inventory(tmp_path)), str(REFERENCE))
    gateway = data["gateway"]
    assert gateway["urls"] == {
        "gpu-node-1": "http://10.0.0.11:8000",
        "gpu-node-2": "http://10.0.0.12:8000",
    }
    assert {h: line.split()[-3] for h, line in gateway["register"].items()} == {
        "gpu-node-1": "gpu-node-1",
        "gpu-node-2": "gpu-node-2",
    }
    topo = data["topology"]
    assert "host: gpu-node-2\n  url: http://10.0.0.12:8000" in topo


THREE_HOSTS = ROOT / "deploy" / "examples" / "three-hosts-ha.ini"


def test_three_hosts_ha_validates_clean_and_names_the_store_for_the_role() -> None:
    dep = load_deployment(THREE_HOSTS)
    assert lint(dep) == []
    etcd = filters.pdstack_deployment(str(THREE_HOSTS), "../profiles/reference.yml")["etcd"]
    assert list(etcd["members"]) == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    assert etcd["initial_cluster"] == (
        "gpu-node-1=https://10.0.0.11:2380,gpu-node-2=https://10.0.0.12:2380,"
        "gpu-node-3=https://10.0.0.13:2380"
    )
    assert etcd["pki_args"] == [
        "--member=gpu-node-1=10.0.0.11", "--member=gpu-node-2=10.0.0.12",
        "--member=gpu-node-3=10.0.0.13",
        "--client=gpu-node-1", "--client=gpu-node-2", "--client=gpu-node-3",
    ]  # fmt: skip
    assert etcd["pki_dir"] == str(THREE_HOSTS.parent / "pki")
    lines = etcd["members"]["gpu-node-2"]["command_lines"]
    # One flag a line, mutual TLS on both listeners, the member's own advertised URLs.
    assert lines[0] == "/usr/bin/etcd"
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        assert flag in lines
    assert "--advertise-client-urls https://10.0.0.12:2379" in lines
    assert "--listen-metrics-urls http://0.0.0.0:2381" in lines
    assert "--key-file /run/credentials/pdstack-etcd.service/member.key" in lines
