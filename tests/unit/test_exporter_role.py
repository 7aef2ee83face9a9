"""roles/pdstack_exporter: a venv changed in an earlier play (site.yml installs pdctl with the
engines first) restarts pd-exporter too. The role's expression is evaluated by real Ansible on
localhost against registered results as its tasks produce them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, role_expression

ROLE = ROOT / "roles" / "pdstack_exporter"
INSTALLED = 1_764_558_000.0  # mtime of the venv's site-packages


def _stale(tmp_path: Path, started: str, site_packages: list[float]) -> bool:
    """_pdstack_exporter_stale for `systemctl show` output `started` and directory mtimes."""
    facts: dict[str, Any] = {
        "__pdstack_exporter_started": {"stdout": started},
        "__pdstack_exporter_site_packages": {"files": [{"mtime": m} for m in site_packages]},
    }
    stale: bool = role_expression(
        tmp_path, ROLE / "vars" / "main.yml", facts, "_pdstack_exporter_stale | bool"
    )
    return stale


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
