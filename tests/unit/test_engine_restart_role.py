"""roles/pdstack_engine: changed groups restart through one `pdctl roll` for the play (the
steps of `pdctl restart --both`), a fresh group is only started, --check lists what would
restart and why, and restart_on_change=false writes "restart pending" markers. The role's
expressions are evaluated by real Ansible on localhost against registered results as the tasks
produce them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import names
from pdctl.ops import site_roll
from tests.conftest import ROOT, role_expression

ROLE = ROOT / "roles" / "pdstack_engine"
UNITS = names.UNIT_DIR


def _handlers() -> list[dict[str, Any]]:
    return yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())


def _roll_tasks() -> list[dict[str, Any]]:
    return yaml.safe_load((ROLE / "tasks" / "roll.yml").read_text())


def _roll_task(prefix: str) -> dict[str, Any]:
    (t,) = [t for t in _roll_tasks() if t["name"].startswith(prefix)]
    return t


def test_one_handler_rolls_the_changed_groups_through_one_pdctl_roll() -> None:
    # One handler for the roll: the role's tasks/roll.yml, on every file change.
    (rolls,) = [h for h in _handlers() if "listen" in h]
    assert rolls["ansible.builtin.include_tasks"] == "roll.yml"
    assert set(rolls["listen"]) == {"pdstack engine files changed", "pdstack venv changed"}
    for t in _handlers() + _roll_tasks():
        sd = t.get("ansible.builtin.systemd_service", {})
        # the engine firewall is the one unit a handler may reload; no engine or pair unit
        if sd.get("name") != "{{ _pdstack_engine_firewall_unit }}":
            assert "state" not in sd, f"{t['name']} changes a unit's state directly"
    # One pdctl call, run once for the play's hosts, with its plan on stdin.
    (calls,) = [t for t in _roll_tasks() if "pdctl" in str(t.get("ansible.builtin.command"))]
    command = calls["ansible.builtin.command"]
    assert command["argv"].startswith("{{ [_pdstack_engine_roll_pdctl, 'roll', '--plan', '-']")
    assert command["stdin"] == "{{ _pdstack_engine_roll_plan | to_json }}"
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert "/bin/pdctl" in role_vars["_pdstack_engine_roll_pdctl"]
    assert calls["run_once"] is True and "throttle" not in calls
    assert calls["delegate_to"] == "{{ _pdstack_engine_roll_on }}"
    # --check lists the groups (the debug task above) and restarts none.
    assert calls["when"].endswith(" and not ansible_check_mode")
    # The plan says every field pdctl roll reads, the lock wait the role's; pdctl roll always
    # takes the fleet restart lock in etcd (the store play runs before the engines).
    plan = role_vars["_pdstack_engine_roll_plan"]
    assert set(plan) == set(site_roll.Plan.model_fields)
    assert plan["lock_wait"] == "{{ pdstack_engine_restart_lock_wait | float }}"
    assert "fleet-lock" not in str(_roll_tasks()) + str(plan)
    assert not [h for h in _handlers() if "gateway.lock" in str(h)]
    # The play stops on the first failure with the message of pdctl's own result.
    stop = _roll_task("Stop at the first group")
    assert stop["any_errors_fatal"] is True and stop["run_once"] is True
    assert stop["ansible.builtin.fail"]["msg"] == "{{ _pdstack_engine_roll_result.message }}"
    assert "stderr" not in str(_roll_tasks()) + role_vars["_pdstack_engine_roll_result"]


def test_every_file_task_notifies_the_restart_path() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    listens = {lst for h in _handlers() for lst in h.get("listen", [])}
    writes = [t for t in tasks if t.get("register", "").startswith("__pdstack_engine_")]
    assert {t["register"] for t in writes} == {
        "__pdstack_engine_envs",
        "__pdstack_engine_pending",
        "__pdstack_engine_targets",
        "__pdstack_engine_units",
        "__pdstack_engine_finish_units",
    }
    for t in writes:
        # The finisher's unit and timer restart no pair: a reload takes them in.
        finisher = t["register"] == "__pdstack_engine_finish_units"
        assert ("pdstack engine files changed" in t["notify"]) is not finisher
    assert {"pdstack engine files changed", "pdstack venv changed"} <= listens


def _results(items: list[tuple[bool, dict[str, Any]]]) -> dict[str, Any]:
    return {"results": [{"changed": c, "item": i} for c, i in items]}


def _inst(pair: str, role: str) -> dict[str, Any]:
    return {
        "env_file": names.env_file(pair, role),
        "inst": {"pair_target": names.pair_target(pair), "unit": names.engine_unit(pair, role)},
    }


def _evaluate(tmp_path: Path, changed: set[str], active: list[str], **extra: Any) -> Any:
    """The role's vars, with pd0..pd2 on host h1, `changed` files (basenames) and systemctl
    is-active lines `active` for the changed pairs."""
    pairs = ["pd0", "pd1", "pd2"]
    insts = [_inst(p, r) for p in pairs for r in names.ROLES]
    base = lambda path: path.rsplit("/", 1)[-1]  # noqa: E731
    facts = {
        "_pdstack_engine_host": {
            "pairs": [{"pair": p, "target": names.pair_target(p)} for p in pairs]
        },
        "_pdstack_engine_layout": {
            "unit_dir": UNITS,
            "venv": names.VENV,
            "restart_pending_dir": names.RESTART_PENDING_DIR,
        },
        "__pdstack_engine_envs": _results([(base(i["env_file"]) in changed, i) for i in insts]),
        "__pdstack_engine_units": _results([(i["inst"]["unit"] in changed, i) for i in insts]),
        "__pdstack_engine_targets": _results(
            [(names.pair_target(p) in changed, {"target": names.pair_target(p)}) for p in pairs]
        ),
        "__pdstack_engine_active": {"stdout_lines": active},
        "__pdstack_pip": {"changed": False},
        "__pdstack_pdctl": {"changed": False},
        "pdstack_engine_restart_on_change": True,
        **extra,
    }
    return role_expression(
        tmp_path,
        ROLE / "vars" / "main.yml",
        facts,
        "{'changed': _pdstack_engine_changed, 'plan': _pdstack_engine_restart_plan, "
        "'running': _pdstack_engine_running_changed}",
    )


def test_changed_files_name_their_pair_and_only_running_pairs_restart(tmp_path: Path) -> None:
    got = _evaluate(
        tmp_path,
        {"pd0-decode.env", names.engine_unit("pd0", "prefill"), names.pair_target("pd2")},
        ["active", "inactive"],  # pd0 runs; pd2 is new (never started)
    )
    assert got["plan"] == [
        f"restart localhost/pd0: /etc/pdstack/pd0-decode.env, {UNITS}/pdstack-pd0-prefill.service",
        f"restart localhost/pd2: {UNITS}/pdstack-pd2.target",
    ]
    assert [p["id"] for p in got["changed"]] == ["localhost/pd0", "localhost/pd2"]
    assert [p["id"] for p in got["running"]] == ["localhost/pd0"]


def test_a_new_venv_changes_every_pair_and_pending_is_said(tmp_path: Path) -> None:
    got = _evaluate(
        tmp_path,
        set(),
        ["active", "active", "active"],
        __pdstack_pip={"changed": True},
        pdstack_engine_restart_on_change="false",  # as -e passes it
    )
    assert [p["pair"] for p in got["running"]] == ["pd0", "pd1", "pd2"]
    assert got["plan"][0] == f"restart pending localhost/pd0: the engine venv ({names.VENV})"


@pytest.mark.parametrize("on_change", [True, False])
def test_a_pending_pair_restarts_once_restart_on_change_is_back(
    tmp_path: Path, on_change: bool
) -> None:
    marker = names.restart_pending("pd1")
    got = _evaluate(
        tmp_path,
        set(),
        ["active"],
        __pdstack_engine_pending={"files": [{"path": marker}]},
        pdstack_engine_restart_on_change=str(on_change).lower(),  # as -e passes it
    )
    if on_change:
        assert got["plan"] == [f"restart localhost/pd1: restart pending ({marker})"]
        assert [p["pair"] for p in got["running"]] == ["pd1"]
    else:  # still pending: nothing new to say, the marker stays as it is
        assert got == {"changed": [], "plan": [], "running": []}


def test_nothing_changed_restarts_nothing(tmp_path: Path) -> None:
    got = _evaluate(tmp_path, set(), [])
    assert got == {"changed": [], "plan": [], "running": []}


def _for_each(template: str, values: list[Any]) -> str:
    """`template` (a role expression reading pdstack_engine_roll_max_unavailable) evaluated for
    each of `values` in one Ansible run: a list of it with the variable replaced by each."""
    body = template.strip().removeprefix("{{").removesuffix("}}").replace("\n", " ")
    each = [body.replace("pdstack_engine_roll_max_unavailable", f"({v!r})") for v in values]
    return "[" + ", ".join(f"({e})" for e in each) + "]"


def test_the_plan_hands_max_unavailable_to_pdctl_as_given(tmp_path: Path) -> None:
    """An integer from -e or the inventory arrives as pdctl's text: 1 rolls without a floor,
    25% is a share of the fleet's groups (site_roll.budget)."""
    plan = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_pdstack_engine_roll_plan"]
    got = role_expression(
        tmp_path,
        ROLE / "vars" / "main.yml",
        {},
        _for_each(plan["max_unavailable"], [1, "1", 2, "25%"]),
    )
    assert got == ["1", "1", "2", "25%"]
    budgets = [site_roll.budget(site_roll.Plan(groups=["g"], max_unavailable=k), 8) for k in got]
    assert [b.max_out for b, _ in budgets] == [1, 1, 2, 2]
    assert [b.min_serving for b, _ in budgets] == [None, None, 6, 6]


def test_preflight_refuses_a_roll_budget_pdctl_would_refuse(tmp_path: Path) -> None:
    (check,) = [
        t
        for t in yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
        if t["name"] == "Check pdstack_engine_roll_max_unavailable"
    ]
    cases = {"1": True, "3": True, "4": False, "0": False, "100%": True, "101%": False}
    cases |= {"x": False, "-1": False, "2.5": False}
    facts = {"__pdstack_deployment": {"hosts": {"h1": {"pairs": [1, 2]}, "h2": {"pairs": [3]}}}}
    that = check["ansible.builtin.assert"]["that"]
    got = role_expression(tmp_path, ROLE / "vars" / "main.yml", facts, _for_each(that, list(cases)))
    assert dict(zip(cases, got, strict=True)) == cases  # the fleet has 3 groups
