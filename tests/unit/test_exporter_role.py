"""roles/pdstack_exporter: a venv changed in an earlier play (site.yml installs pdctl with the
engines first) restarts pd-exporter too. The role's expression is evaluated by real Ansible on
localhost against registered results as its tasks produce them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

ROLE = ROOT / "roles" / "pdstack_exporter"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
INSTALLED = 1_764_558_000.0  # mtime of the venv's site-packages


def _stale(tmp_path: Path, started: str, site_packages: list[float]) -> bool:
    """_pdstack_exporter_stale for `systemctl show` output `started` and directory mtimes."""
    if not PLAYBOOK.exists():
        pytest.skip(f"{PLAYBOOK} not found; run scripts/setup.sh")
    facts: dict[str, Any] = {
        "__pdstack_exporter_started": {"stdout": started},
        "__pdstack_exporter_site_packages": {"files": [{"mtime": m} for m in site_packages]},
        "ansible_python_interpreter": sys.executable,
    }
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / "main.yml")],
            "tasks": [
                {
                    "ansible.builtin.copy": {
                        "dest": str(tmp_path / "out.json"),
                        "content": "{{ _pdstack_exporter_stale | bool | to_json }}",
                        "mode": "0644",
                    }
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    env = dict(
        os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false"
    )
    r = subprocess.run(
        [str(PLAYBOOK), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
         "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=ROOT, env=env, text=True, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result: bool = json.loads((tmp_path / "out.json").read_text())
    return result


@pytest.mark.parametrize(
    ("started", "site_packages", "stale"),
    [
        (f"@{INSTALLED - 60:.0f}", [INSTALLED], True),  # pdctl reinstalled after it started
        (f"@{INSTALLED + 60:.0f}", [INSTALLED], False),  # restarted since (second run: ok)
        ("", [INSTALLED], False),  # not running: nothing to restart
        (f"@{INSTALLED:.0f}", [], False),  # no venv yet (--check on a fresh host)
    ],
)
def test_pd_exporter_older_than_the_venv_is_stale(
    tmp_path: Path, started: str, site_packages: list[float], stale: bool
) -> None:
    assert _stale(tmp_path, started, site_packages) is stale


def test_a_stale_pd_exporter_is_restarted_by_its_handler() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "run.yml").read_text())
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    (restart,) = [t for t in tasks if t.get("notify") == "Restart pd-exporter"]
    assert restart["when"] == "_pdstack_exporter_stale | bool"
    (handler,) = [h for h in handlers if h["name"] == "Restart pd-exporter"]
    assert handler["listen"] == "pdstack venv changed"  # a change in the same play, too
    reads = {t["register"]: t for t in tasks if "register" in t}
    started = reads["__pdstack_exporter_started"]["ansible.builtin.command"]["argv"]
    assert "--timestamp=unix" in started and started[-1] == "{{ _pdstack_exporter_unit }}"
    assert reads["__pdstack_exporter_started"]["check_mode"] is False
    find = reads["__pdstack_exporter_site_packages"]["ansible.builtin.find"]
    assert find["paths"] == "{{ _pdstack_exporter_layout.venv }}/lib"
    assert find["patterns"] == "site-packages"
