"""roles/pdstack_exporter: pd-exporter runs from the pdctl environment site.yml built this run;
a new environment's content changes its unit (and restarts it), a new path of the same content
is switched in place first (and restarts nothing). The role's expressions are evaluated by real
Ansible on localhost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdctl import names
from tests.conftest import ROOT, role_expression

ROLE = ROOT / "roles" / "pdstack_exporter"
PDCTL_ENV = f"{names.ENVS_DIR}/pdctl-0.1.0-0123456789ab"


def _configure() -> list[dict[str, Any]]:
    return yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())


def test_pd_exporter_runs_from_the_pdctl_environment_built_this_run(tmp_path: Path) -> None:
    facts = {"__pdstack_envs": {"pdctl": {"path": PDCTL_ENV}, "engine": {"path": "/e"}}}
    env = role_expression(tmp_path, ROLE / "vars" / "main.yml", facts, "_pdstack_exporter_env")
    assert env == PDCTL_ENV
    unit = (ROLE / "templates" / "pd-exporter.service.j2").read_text()
    assert "ExecStart={{ _pdstack_exporter_env }}/bin/python -m pdctl.exporter" in unit


def test_same_content_is_switched_before_the_unit_is_written_and_only_reloads() -> None:
    switch, write = _configure()
    argv = switch["ansible.builtin.command"]["argv"]
    assert "_pdstack_envs_repoint" in argv and "'python=' ~ _pdstack_exporter_env" in argv
    assert switch["notify"] == "Reload systemd"  # no restart for a path alone
    assert write["ansible.builtin.template"]["src"] == "pd-exporter.service.j2"
    assert write["notify"] == "Restart pd-exporter"  # new content: a new ExecStart
    handlers = {h["name"]: h for h in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())}
    assert handlers["Reload systemd"]["ansible.builtin.systemd_service"] == {"daemon_reload": True}
    assert (
        handlers["Restart pd-exporter"]["ansible.builtin.systemd_service"]["state"] == "restarted"
    )


def test_the_role_builds_only_the_pdctl_environment_and_prunes_after_its_start() -> None:
    (install, _user) = yaml.safe_load((ROLE / "tasks" / "install.yml").read_text())
    assert install["vars"] == {"pdstack_envs": ["pdctl"]}
    *_, prune = yaml.safe_load((ROLE / "tasks" / "run.yml").read_text())
    assert prune["ansible.builtin.import_role"] == {"name": "pdstack", "tasks_from": "prune.yml"}
