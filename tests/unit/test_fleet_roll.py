"""site.yml's one roll for the play (roles/pdstack_engine/handlers/main.yml): the groups every
host hands in, once each by id; where pdctl runs it (their host, else the controller); the
engines the controller must reach first; and the ssh settings pdctl gets from the inventory
(pdctl.converge)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import converge, names
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


def test_the_controller_checks_each_engine_of_the_roll() -> None:
    def inst(host: str, pair: str, role: str, port: int) -> dict[str, object]:
        url = f"http://{host}.example:{port}"
        return {"inst": {"id": f"{host}/{pair}-{role}", "pair": pair, "url": url}}

    hosts = {
        h: {"instances": [inst(h, p, r, 30000 + 10 * n + m) for n, p in enumerate(["pd0", "pd1"])
                          for m, r in enumerate(["prefill", "decode"])]}
        for h in ("h1", "h2")
    }  # fmt: skip
    roll = [{"id": "h1/pd1", "hosts": ["h1"]}, {"id": "h2/pd0", "hosts": ["h2"]}]
    assert converge.roll_engines(roll, hosts) == [
        {"id": "h1/pd1-prefill", "url": "http://h1.example:30010"}
        | {"address": "h1.example", "port": 30010},
        {"id": "h1/pd1-decode", "url": "http://h1.example:30011"}
        | {"address": "h1.example", "port": 30011},
        {"id": "h2/pd0-prefill", "url": "http://h2.example:30000"}
        | {"address": "h2.example", "port": 30000},
        {"id": "h2/pd0-decode", "url": "http://h2.example:30001"}
        | {"address": "h2.example", "port": 30001},
    ]


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


def _handler(name: str) -> dict[str, Any]:
    (handler,) = [
        h for h in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text()) if h["name"] == name
    ]
    return handler


def _with_handler_vars(tmp_path: Path, **templates: str) -> Path:
    """The role's vars file plus `templates` (a handler's fields) as variables: Ansible
    templates them as the handler's task would."""
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text()) | templates
    path = tmp_path / "vars_and_handler.yml"
    path.write_text(yaml.safe_dump(variables))
    return path


def test_the_role_runs_the_controllers_pdctl_with_the_inventorys_ssh(tmp_path: Path) -> None:
    """Through real Ansible and the role's vars: the hosts' handed-in groups make one roll;
    on the controller the command is the playbook's own pdctl, `restart` with -i/-p, and pdctl
    gets ssh settings built from the inventory's connection variables."""
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
        "__pdstack_engine_roll_dir": {"path": "/tmp/x.pdstack-roll"},
        "pdstack_engine_restart_lock_wait": 600,
        "pdstack_engine_roll_max_unavailable": "2",
    }
    restart = _handler("Restart changed PD pairs one at a time (drain, restart, canary, register)")
    got = role_expression(
        tmp_path,
        _with_handler_vars(tmp_path, _argv=restart["ansible.builtin.command"]["argv"]),
        facts,
        "{'roll': _pdstack_engine_roll, 'on': _pdstack_engine_roll_on, 'argv': _argv, "
        "'env': _pdstack_engine_roll_env, "
        "'ssh': _pdstack_engine_roll_ssh_hosts | pdstack_ssh_config(_pdstack_engine_dep.hosts, "
        "true)}",
        inventory=inventory,
    )
    assert got["roll"] == [
        {"id": "localhost/pd0", "hosts": ["localhost"]},
        {"id": "localhost/pd1", "hosts": ["localhost"]},
    ]
    assert got["on"] == "localhost"
    assert got["argv"] == [
        str(ROOT / ".venv" / "bin" / "pdctl"),
        "restart",  # -i/-p are the command's options: after it
        "--both",
        "--yes",
        "--lock-wait",
        "600",
        "-i",
        str(tmp_path / "hosts.ini"),
        "-p",
        "/srv/profile.yml",
        "--max-unavailable",
        "2",
        "--include-drained",
        "--pair=localhost/pd0",
        "--pair=localhost/pd1",
    ]
    assert got["env"] == {
        "PDCTL_SSH_CONFIG": "/tmp/x.pdstack-roll/ssh_config",
        "PDCTL_LOCK": "/tmp/x.pdstack-roll/restart.lock",
        "PDSTACK_GATEWAY_API_KEY": "",
    }
    assert got["ssh"].splitlines() == [
        "Host 127.0.0.1",
        "  HostName 127.0.0.1",
        "  User root",
        "  Include /srv/fleet/ssh_config",
    ]
    # pdctl takes that command line (its options parsed, up to loading the inventory).
    help_ = subprocess.run(
        [*got["argv"][:2], "--help"], text=True, capture_output=True, check=True
    ).stdout
    assert all(opt in help_ for opt in ("-i,", "-p,", "--max-unavailable", "--lock-wait"))


def test_the_plays_failure_names_the_failed_and_the_untouched_groups(tmp_path: Path) -> None:
    """The failure handler's message keeps pdctl's lines about groups (of any host), its
    errors and the untouched list, and drops the progress and journal lines."""
    handler = _handler("Stop at the first pair that failed to restart")
    assert handler["run_once"] is True and handler["any_errors_fatal"] is True
    stderr = [
        "roll: out h1/pd0, h2/pd0; done 0 of 4; left 2",
        "h1/pd0: restarting pdstack-pd0-prefill.service + pdstack-pd0-decode.service",
        "h2/pd0: restarting pdstack-pd0-prefill.service + pdstack-pd0-decode.service",
        "h2/pd0: health: not healthy after 600s (the pair stays out of the gateway)",
        "g1: restarting pdstack-g1-prefill0.service + pdstack-g1-decode0.service",
        "--- journalctl -u pdstack-pd0-prefill.service (last 30 lines)",
        "  h2 sim[1]: boom",
        "stopping the roll; untouched: h2/pd1, h3/pd0",
    ]
    facts = {
        "__pdstack_engine_restarted": {"rc": 1, "stderr_lines": stderr},
        # A group across hosts in the roll: its lines start with its bare id.
        "__pdstack_engine_roll_mine": [{"id": "g1", "pair": "g1", "host": "localhost"}],
    }
    msg = handler["ansible.builtin.fail"]["msg"]
    variables = _with_handler_vars(tmp_path, _message=msg, **handler["vars"])
    got = role_expression(tmp_path, variables, facts, "_message")
    assert got.startswith("pdctl restart failed (exit 1):"), got
    assert (
        "h1/pd0: restarting pdstack-pd0-prefill.service + pdstack-pd0-decode.service | "
        "h2/pd0: restarting pdstack-pd0-prefill.service + pdstack-pd0-decode.service | "
        "h2/pd0: health: not healthy after 600s (the pair stays out of the gateway) | "
        "g1: restarting pdstack-g1-prefill0.service + pdstack-g1-decode0.service | "
        "stopping the roll; untouched: h2/pd1, h3/pd0."
    ) in got, got
    assert "roll: out" not in got and "boom" not in got
