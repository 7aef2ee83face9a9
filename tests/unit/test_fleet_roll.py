"""site.yml's one roll for the play (roles/pdstack_engine/tasks/roll.yml): the groups every
host hands in, once each by id; where `pdctl roll` runs (their host, else the controller); its
plan with the ssh settings pdctl gets from the inventory (pdctl.converge); and the play's
failure, the message of pdctl's own result."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import converge, names
from pdctl.ops import site_roll
from pdctl.ops.lock import LockHeld
from pdctl.ops.report import Report
from tests.conftest import ROOT, require_path, role_expression

ROLE = ROOT / "roles" / "pdstack_engine"


def _mine(host: str, *pairs: str) -> list[dict[str, str]]:
    """A host's running changed groups as its handler hands them in."""
    return [{"id": f"{host}/{p}", "pair": p, "host": host} for p in pairs]


def test_every_hosts_groups_roll_once_each_in_inventory_order() -> None:
    # A group across hosts is handed in by each of its hosts: restarted once.
    shared = {"id": "h1/x0", "pair": "x0", "host": "h2"}
    roll = converge.roll_groups([_mine("h1", "pd0", "x0"), [], [*_mine("h2", "pd0"), shared]])
    assert roll == [
        {"id": "h1/pd0", "hosts": ["h1"]},
        {"id": "h1/x0", "hosts": ["h1", "h2"]},
        {"id": "h2/pd0", "hosts": ["h2"]},
    ]
    assert converge.roll_hosts(roll) == ["h1", "h2"]
    assert converge.roll_runs_on(roll) == "localhost"  # several hosts: the controller
    one = converge.roll_groups([_mine("h2", "pd0", "pd1")])
    assert converge.roll_runs_on(one) == "h2"  # one host: there, as before
    assert converge.roll_groups([[], []]) == []


DEPLOYMENT = {"gpu-1": {"address": "10.0.0.1"}, "gpu-2": {"address": "gpu-2.lan"}}


def test_ssh_settings_follow_the_inventory_with_ansibles_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    hosts = [
        {
            "inventory_hostname": "gpu-1",
            "ansible_host": "10.0.0.1",
            "ansible_user": "root",
            "ansible_ssh_common_args": "-F fleet/ssh_config -o IdentitiesOnly=yes",
        },
        {
            "inventory_hostname": "gpu-2",
            "ansible_port": 2222,
            "ansible_ssh_private_key_file": "/keys/id",
            "ansible_ssh_common_args": "-o 'ProxyJump bastion' -oServerAliveInterval=5",
            "ansible_ssh_extra_args": "-i /keys/other -p 22",
        },
    ]
    assert converge.ssh_config(hosts, DEPLOYMENT, True).splitlines() == [
        "Host 10.0.0.1",
        "  HostName 10.0.0.1",
        "  User root",
        f"  Include {tmp_path}/fleet/ssh_config",
        "  IdentitiesOnly yes",
        "Host gpu-2.lan",
        "  Port 2222",
        "  User root",
        "  IdentityFile /keys/id",  # Ansible's variable before its arguments: first wins
        "  ProxyJump bastion",
        "  ServerAliveInterval 5",
        "  IdentityFile /keys/other",
        "  Port 22",
    ]
    # Ansible run without host key checking (this repo's ansible.cfg): pdctl's ssh the same,
    # in a block after the -F file's, whose own setting comes first.
    text = converge.ssh_config(hosts[:1], DEPLOYMENT, False)
    assert text.endswith(
        "Host 10.0.0.1\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
    )


def test_ssh_itself_reads_the_settings_as_ansible_would(tmp_path: Path) -> None:
    """`ssh -G` (the options ssh would use, without connecting): the inventory's -F file's
    pinned host keys win over the no-check default, which applies where nothing else says."""
    ssh = require_path(shutil.which("ssh"), "ssh")
    fleet = tmp_path / "fleet_config"
    fleet.write_text(
        "Host gpu-1 10.0.0.1\n  IdentityFile /keys/gpu-1\n  StrictHostKeyChecking yes\n"
        "  UserKnownHostsFile /keys/known_hosts\n"
    )
    hosts = [
        {"inventory_hostname": "gpu-1", "ansible_ssh_common_args": f"-F {fleet}"},
        {"inventory_hostname": "gpu-2", "ansible_host": "10.0.0.2", "ansible_port": 2222},
    ]
    config = tmp_path / "ssh_config"
    config.write_text(converge.ssh_config(hosts, DEPLOYMENT, False))

    def resolved(address: str) -> dict[str, str]:
        argv = [str(ssh), "-G", "-F", str(config), f"root@{address}"]
        out = subprocess.run(argv, text=True, capture_output=True, check=True).stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)

    one, two = resolved("10.0.0.1"), resolved("gpu-2.lan")
    assert (one["user"], one["identityfile"]) == ("root", "/keys/gpu-1")
    assert (one["stricthostkeychecking"], one["userknownhostsfile"]) == (
        "true",
        "/keys/known_hosts",
    )
    assert (two["hostname"], two["port"], two["stricthostkeychecking"]) == (
        "10.0.0.2",
        "2222",
        "false",
    )


@pytest.mark.parametrize(
    ("host", "error"),
    [
        (
            {"ansible_user": "admin"},
            "gpu-1: the roll of several hosts runs pdctl on the controller",
        ),
        ({"ansible_ssh_common_args": "-A"}, "gpu-1: the ssh option '-A' cannot be passed on"),
        ({"ansible_ssh_extra_args": "-o"}, "gpu-1: the ssh option '-o' cannot be passed on"),
    ],
)
def test_ssh_settings_pdctl_cannot_use_are_refused_naming_the_host(
    host: dict[str, str], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        converge.ssh_config([{"inventory_hostname": "gpu-1", **host}], DEPLOYMENT, True)


def _roll_task(prefix: str) -> dict[str, Any]:
    (task,) = [
        t
        for t in yaml.safe_load((ROLE / "tasks" / "roll.yml").read_text())
        if t["name"].startswith(prefix)
    ]
    return task


def _with_task_vars(tmp_path: Path, **templates: str) -> Path:
    """The role's vars file plus `templates` (a task's fields) as variables: Ansible
    templates them as the task would."""
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text()) | templates
    path = tmp_path / "vars_and_task.yml"
    path.write_text(yaml.safe_dump(variables))
    return path


def test_the_role_runs_the_controllers_pdctl_with_the_inventorys_ssh(tmp_path: Path) -> None:
    """Through real Ansible and the role's vars: the hosts' handed-in groups make one roll;
    on the controller the command is the playbook's own pdctl, `roll` with -i/-p, and its plan
    carries the ssh settings built from the inventory's connection variables."""
    inventory = (
        "localhost ansible_host=127.0.0.1 ansible_user=root "
        "ansible_ssh_common_args='-F /srv/fleet/ssh_config'\n"
    )
    facts = {
        "__pdstack_engine_roll_mine": _mine("localhost", "pd0", "pd1"),
        "__pdstack_deployment": {
            "profile": "/srv/profile.yml",
            "layout": {"venv": names.VENV},
            "hosts": {"localhost": {"address": "127.0.0.1"}},
        },
        "pdstack_engine_restart_lock_wait": 600,
        "pdstack_engine_roll_max_unavailable": 2,
    }
    command = _roll_task("Roll the changed groups")["ansible.builtin.command"]
    got = role_expression(
        tmp_path,
        _with_task_vars(tmp_path, _argv=command["argv"], _stdin=command["stdin"]),
        facts,
        "{'roll': _pdstack_engine_roll, 'on': _pdstack_engine_roll_on, 'argv': _argv, "
        "'stdin': _stdin, 'env': _pdstack_engine_roll_env}",
        inventory=inventory,
    )
    assert got["roll"] == [
        {"id": "localhost/pd0", "hosts": ["localhost"]},
        {"id": "localhost/pd1", "hosts": ["localhost"]},
    ]
    assert got["on"] == "localhost"
    # The playbook's own pdctl (ansible_playbook_python is the venv's python, links resolved).
    assert Path(got["argv"][0]).resolve() == (ROOT / ".venv" / "bin" / "pdctl").resolve()
    assert got["argv"][1:] == [
        "roll",  # -i/-p are the command's options: after it
        "--plan",
        "-",
        "-i",
        str(tmp_path / "hosts.ini"),
        "-p",
        "/srv/profile.yml",
    ]
    plan = site_roll.Plan.model_validate_json(got["stdin"])  # what pdctl roll reads
    assert plan.groups == ["localhost/pd0", "localhost/pd1"]
    assert (plan.max_unavailable, plan.lock_wait) == ("2", 600.0)
    assert plan.ssh_config is not None and plan.ssh_config.splitlines() == [
        "Host 127.0.0.1",
        "  HostName 127.0.0.1",
        "  User root",
        "  Include /srv/fleet/ssh_config",
        # Ansible's own host key checking (this repo's ansible.cfg: off), as the role reads it.
        "Host 127.0.0.1",
        "  StrictHostKeyChecking no",
        "  UserKnownHostsFile /dev/null",
    ]
    assert got["env"] == {"PDSTACK_GATEWAY_API_KEY": ""}
    # pdctl takes that command line (its options parsed, up to loading the inventory).
    help_ = subprocess.run(
        [*got["argv"][:2], "--help"], text=True, capture_output=True, check=True
    ).stdout
    assert all(opt in help_ for opt in ("-i,", "-p,", "--plan"))


def test_on_the_groups_own_host_the_plan_has_no_ssh_settings(tmp_path: Path) -> None:
    """All on host gpu-1 (handed in by it): the roll runs there, with the host's pdctl."""
    facts = {
        "__pdstack_engine_roll_mine": _mine("gpu-1", "pd0"),
        "__pdstack_deployment": {"profile": "/p.yml", "layout": {"venv": names.VENV}},
        "pdstack_engine_restart_lock_wait": 0,
        "pdstack_engine_roll_max_unavailable": "1",
    }
    got = role_expression(
        tmp_path,
        ROLE / "vars" / "main.yml",
        facts,
        "{'on': _pdstack_engine_roll_on, 'pdctl': _pdstack_engine_roll_pdctl, "
        "'plan': _pdstack_engine_roll_plan}",
    )
    assert (got["on"], got["pdctl"]) == ("gpu-1", f"{names.VENV}/bin/pdctl")
    assert got["plan"] == {
        "groups": ["gpu-1/pd0"],
        "max_unavailable": "1",
        "lock_wait": 0.0,
        "ssh_config": None,
    }


def _failed_result() -> site_roll.Result:
    """pdctl roll's result for h2/pd0 failed at its health wait, h1/pd0 restarted before it
    and g1 (a group across hosts) untouched."""
    reports = [
        Report("h1/pd0", phase="register", phases={"drain": 0.1, "register": 0.2}),
        Report(
            "h2/pd0",
            ok=False,
            error="health: not healthy after 600s (the group stays out of the gateway)",
            phase="health",
            phases={"drain": 0.1, "stop": 1.0, "start": 0.1, "health": 600.0},
            journal={"pdstack-pd0-decode.service": ["boom"]},
        ),
    ]
    return site_roll.result(["h1/pd0", "h2/pd0", "g1"], reports)


def test_the_plays_failure_is_the_message_of_pdctls_result(tmp_path: Path) -> None:
    """The failure task's message is the result's, which names the failed group and how, and
    the groups restarted and untouched, and leaves out the progress and journal lines."""
    stop = _roll_task("Stop at the first group")
    assert stop["run_once"] is True and stop["any_errors_fatal"] is True
    result = _failed_result()
    assert result.message == (
        "pdctl roll failed (exit 1): h2/pd0: health: not healthy after 600s (the group stays "
        "out of the gateway); restarted: h1/pd0; untouched: g1. A failed group stays out of "
        "the gateways and the groups after it were not restarted: pdctl status."
    )
    roll = _roll_task("Roll the changed groups")
    cases = {
        "failed": {"rc": 1, "stdout": result.model_dump_json(indent=2)},
        "untouched": {
            "rc": 3,
            "stdout": site_roll.refused(["g1"], LockHeld("held")).model_dump_json(),
        },
        "no result": {"rc": 1, "stdout": ""},
        # Skipped (--check, or no group runs): what the command module answers in check mode.
        "skipped": {"rc": 0, "stdout": "", "skipped": True, "changed": False},
    }
    got = {}
    for case, rolled in cases.items():
        got[case] = role_expression(
            tmp_path,
            _with_task_vars(tmp_path, _message=stop["ansible.builtin.fail"]["msg"],
                            _changed="{{ " + roll["changed_when"] + " }}",
                            _fails="{{ " + stop["when"] + " }}"),
            {"__pdstack_engine_rolled": rolled},
            "{'message': _message, 'changed': _changed, 'fails': _fails}",
        )  # fmt: skip
    assert got["failed"] == {"message": result.message, "changed": True, "fails": True}
    assert got["untouched"]["changed"] is False and got["untouched"]["fails"] is True
    assert got["untouched"]["message"].startswith("pdctl roll failed (exit 3): held; untouched: g1")
    assert got["no result"]["fails"] is True and got["no result"]["changed"] is False
    assert got["no result"]["message"].startswith("pdctl roll ended (exit 1) without its result")
    assert got["skipped"]["fails"] is False
