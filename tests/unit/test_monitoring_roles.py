"""The monitoring roles' templates: Ansible installs the rules `python -m monitoring.build`
makes, the Prometheus configuration generated for the reference
deployment passes promtool, and the Grafana provisioning keeps its fixed uid and read-only
flags."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.errors import AnsibleFilterError

from monitoring.build import DASHBOARDS_DIR
from monitoring.config import load
from monitoring.rules import render_rules
from pdctl.spec import load_deployment
from pdctl.topology import from_deployment
from tests.conftest import (
    ROOT,
    filter_plugin,
    require_tool,
    role_expression,
    two_gateways_inventory,
)
from tests.prometheus_role import render_prometheus_config, templates

GRAFANA_VARS = ROOT / "roles" / "pdstack_grafana" / "vars" / "main.yml"
PROMETHEUS_VARS = ROOT / "roles" / "pdstack_prometheus" / "vars" / "main.yml"


def _ansible_writes(tmp_path: Path, content: str, extra_vars: dict[str, object]) -> str:
    """What Ansible (an ad-hoc copy, the roles' filters and `playbook_dir` the checkout)
    writes for `content` with `extra_vars`."""
    out = tmp_path / "written"
    result = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible"),
            "localhost",
            "-c",
            "local",
            "--playbook-dir",
            str(ROOT),
            "-m",
            "copy",
            "-a",
            json.dumps({"content": content, "dest": str(out)}),
            "-e",
            json.dumps(extra_vars),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out.read_text()


def _role_var(vars_file: Path, name: str) -> dict[str, object]:
    """A role's internal variable (its expression), to hand an ad-hoc run."""
    return {name: yaml.safe_load(vars_file.read_text())[name]}


def test_ansible_installs_the_rules_the_build_makes(tmp_path: Path) -> None:
    """The role's content expression, run by Ansible: the pack's rules with the deployment's
    thresholds and runbook address, Prometheus' own {{ }} templating left alone."""
    rb = "https://git.example.org/pdstack/docs/runbook.md"
    written = _ansible_writes(
        tmp_path,
        "{{ _pdstack_prometheus_rules }}",
        {
            "pdstack_prometheus_alert_thresholds": {"ttft_p95_seconds": 3.5},
            "pdstack_prometheus_runbook_url": rb,
            **_role_var(PROMETHEUS_VARS, "_pdstack_prometheus_rules"),
        },
    )
    built = render_rules(load({"thresholds": {"ttft_p95_seconds": 3.5}, "runbook_url": rb}))
    assert written == built
    assert "{{ $labels.pair }}" in built and "> 3.5" in built


@pytest.mark.parametrize(
    ("thresholds", "runbook", "message"),
    [
        ({"ttft_p95": 1}, "", "unknown key thresholds.ttft_p95"),
        ({}, "docs/runbook.md", "runbook_url must be an absolute http(s) address"),
    ],
)
def test_the_rule_filter_names_what_cannot_build(
    thresholds: dict[str, object], runbook: str, message: str
) -> None:
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        filter_plugin().pdstack_monitoring_rules(thresholds, runbook)


def _grafana_dashboards(tmp_path: Path, source: str) -> list[str]:
    """The dashboards pdstack_grafana installs (its configure loop), as Ansible lists them."""
    listed = _ansible_writes(
        tmp_path,
        "{{ query('ansible.builtin.fileglob', _pdstack_grafana_dashboards_source ~ '/*.json')"
        " | map('basename') | list | to_json }}",
        {
            "pdstack_grafana_dashboards_source": source,
            **_role_var(GRAFANA_VARS, "_pdstack_grafana_dashboards_source"),
        },
    )
    return sorted(json.loads(listed))


def test_grafana_installs_the_committed_build_or_the_deployments(tmp_path: Path) -> None:
    committed = sorted(p.name for p in DASHBOARDS_DIR.glob("*.json"))
    assert len(committed) == 5
    assert _grafana_dashboards(tmp_path, "") == committed
    own = tmp_path / "pack" / "dashboards"
    own.mkdir(parents=True)
    (own / "pdstack-overview.json").write_text("{}")
    assert _grafana_dashboards(tmp_path, str(own)) == ["pdstack-overview.json"]


@pytest.fixture
def reference_config(tmp_path: Path) -> Path:
    dep = load_deployment(ROOT / "inventory.ini")
    hostvars = {h.name: {} for h in dep.hosts}
    ports = {"exporter": 9840, "node": 9100}
    return render_prometheus_config(
        tmp_path, from_deployment(dep), hostvars, ports, render_rules(), "15s", "10s"
    )


def test_reference_deployment_config_passes_promtool(reference_config: Path) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [str(promtool), "check", "config", str(reference_config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_reference_targets_carry_the_labels_rules_join_on(reference_config: Path) -> None:
    targets = reference_config.parent / "targets"
    engines = json.loads((targets / "sglang.json").read_text())
    assert {g["labels"]["engine"] for g in engines} == {
        "gpu-node-1/pd0-prefill",
        "gpu-node-1/pd0-decode",
    }
    assert {g["labels"]["pair"] for g in engines} == {"gpu-node-1/pd0"}
    assert [g["targets"] for g in engines] == [["gpu-node-1:30000"], ["gpu-node-1:30001"]]
    (gateway,) = json.loads((targets / "smg.json").read_text())
    assert gateway["targets"] == ["gpu-node-1:29000"]
    for job in ("pd-exporter", "node"):
        groups = json.loads((targets / f"{job}.json").read_text())
        assert all(set(g["labels"]) == {"host"} for g in groups), "no label pd-exporter sets"


def test_sglang_names_are_stored_with_their_colon(reference_config: Path) -> None:
    (engines,) = [
        j
        for j in yaml.safe_load(reference_config.read_text())["scrape_configs"]
        if j["job_name"] == "sglang"
    ]
    (relabel,) = engines["metric_relabel_configs"]
    assert relabel == {
        "source_labels": ["__name__"],
        "regex": "sglang_(.+)",
        "target_label": "__name__",
        "replacement": "sglang:$1",
    }


def test_grafana_provisioning_is_read_only_with_a_fixed_uid() -> None:
    role_vars = yaml.safe_load(GRAFANA_VARS.read_text())
    (ds,) = role_vars["_pdstack_grafana_datasource"]["datasources"]
    assert ds["uid"] == "pdstack-prometheus" and ds["editable"] is False
    (provider,) = role_vars["_pdstack_grafana_dashboard_provider"]["providers"]
    assert provider["allowUiUpdates"] is False and provider["type"] == "file"
    defaults = yaml.safe_load((GRAFANA_VARS.parent.parent / "defaults" / "main.yml").read_text())
    assert "pdstack_grafana_admin_password" not in defaults, "no default password"
    assert defaults["pdstack_grafana_anonymous_access"] is False


def test_every_gateway_is_a_scrape_target(tmp_path: Path) -> None:
    topo = from_deployment(load_deployment(two_gateways_inventory(tmp_path)))
    text = templates().get_template("gateway.json.j2").render(topology=topo.model_dump(mode="json"))
    assert json.loads(text) == [
        {"targets": ["10.0.0.11:29000"], "labels": {"role": "gateway", "host": "gpu-node-1"}},
        {"targets": ["10.0.0.12:29000"], "labels": {"role": "gateway", "host": "gpu-node-2"}},
    ]


GRAFANA = GRAFANA_VARS.parent.parent


def _grafana_env(password: str) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(GRAFANA / "templates"), undefined=jinja2.StrictUndefined
    )
    return env.get_template("grafana.env.j2").render(
        ansible_managed="m",
        pdstack_grafana_admin_password=password,
        pdstack_grafana_anonymous_access=False,
        pdstack_grafana_listen_address="127.0.0.1",
        pdstack_grafana_port=3000,
        _pdstack_grafana_provisioning_dir="/etc/grafana/provisioning",
    )


@pytest.mark.parametrize(
    "password", ['pl"ain$HOME `id` \\n x', "with spaces and 'quotes'", "a$$b%%c\\\\d"]
)
def test_grafana_password_is_quoted_in_the_env_file(password: str) -> None:
    """systemd unescapes backslash, double quote, backquote and dollar in a double-quoted env
    value exactly as sh does: read back by sh, each character of the password stays literal."""
    (line,) = [
        ln for ln in _grafana_env(password).splitlines() if ln.startswith("GF_SECURITY_ADMIN")
    ]
    value = line.split("=", 1)[1]
    assert value.startswith('"') and value.endswith('"')
    read = subprocess.run(
        ["/bin/sh", "-c", f"{line}\nprintf %s \"$GF_SECURITY_ADMIN_PASSWORD\""],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    assert read.stdout == password


def test_grafana_listens_on_loopback_by_default() -> None:
    defaults = yaml.safe_load((GRAFANA / "defaults" / "main.yml").read_text())
    assert defaults["pdstack_grafana_listen_address"] == "127.0.0.1"


def test_a_rotated_grafana_password_is_applied_and_then_recorded() -> None:
    tasks = yaml.safe_load((GRAFANA / "tasks" / "run.yml").read_text())
    names = [t["name"] for t in tasks]
    health = names.index("Wait until Grafana is healthy")
    read, reset, record = (
        names.index("Read which admin password Grafana has"),
        names.index("Apply a changed admin password"),
        names.index("Record the applied admin password (sha256, root only)"),
    )
    assert health < read < reset < record, "reset on a running Grafana, record only after it"
    task = tasks[reset]
    role_vars = yaml.safe_load(GRAFANA_VARS.read_text())
    argv = role_vars["_pdstack_grafana_reset_password"]
    assert argv[argv.index("admin") :] == ["admin", "reset-admin-password", "--password-from-stdin"]
    assert task["ansible.builtin.command"]["stdin"] == "{{ pdstack_grafana_admin_password }}"
    assert task["no_log"] is True and task["become_user"] == "grafana"
    # Skipped exactly when the recorded hash is the current password's.
    assert any("_pdstack_grafana_password_sha256" in cond for cond in task["when"])
    assert tasks[record]["ansible.builtin.copy"]["content"].startswith(
        "{{ _pdstack_grafana_password_sha256 }}"
    )
    assert tasks[record]["ansible.builtin.copy"]["mode"] == "0600"


def test_every_uri_wait_bounds_each_request() -> None:
    """A server that accepts and never answers cannot stretch a wait beyond its total."""
    waits = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            if "ansible.builtin.uri" in task:
                waits.append(task["name"])
                assert task["ansible.builtin.uri"].get("timeout"), f"{path}: {task['name']}"
    assert len(waits) == 3, waits


def test_node_exporter_targets_list_each_host_once(tmp_path: Path) -> None:
    """A host in several groups (the reference inventory's one host is in all) is one target."""
    hosts = role_expression(
        tmp_path,
        ROOT / "roles" / "pdstack_prometheus" / "vars" / "main.yml",
        {"__pdstack_deployment": {"hosts": {"localhost": {}, "gpu2": {}}}},
        "_pdstack_prometheus_node_hosts",
        inventory="[pd_hosts]\nlocalhost\ngpu2\n[router]\ngw\nlocalhost\n[monitoring]\nlocalhost\n",
    )
    assert hosts == ["localhost", "gpu2", "gw"]
