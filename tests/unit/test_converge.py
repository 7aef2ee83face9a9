"""pdctl.converge: the roles' decisions, fed the registered results as Ansible's loop tasks
produce them (roles/pdstack_engine/tasks/configure.yml and firewall.yml, pdstack_exporter and
pdstack_gateway run.yml). tests/unit/test_engine_restart_role.py evaluates the same through
the role's vars file and real Ansible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl import converge, names
from tests.conftest import ROOT, filter_plugin, role_expression, two_gateways_inventory

UNITS = names.UNIT_DIR
LAYOUT = {"unit_dir": UNITS, "venv": names.VENV, "restart_pending_dir": names.RESTART_PENDING_DIR}
PAIRS = ["pd0", "pd1", "pd2"]
REFERENCE = ROOT / "deploy" / "profiles" / "reference.yml"


def _results(items: list[tuple[bool, dict[str, Any]]]) -> list[dict[str, Any]]:
    # What a template task in a loop registers per item (its `results`).
    return [{"changed": c, "item": i, "diff": [], "failed": False} for c, i in items]


def _registered(changed: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The env, unit and target loops' results, with the files named in `changed` (basenames)
    changed."""
    insts = [
        {
            "env_file": names.env_file(p, r),
            "inst": {"pair_target": names.pair_target(p), "unit": names.engine_unit(p, r)},
        }
        for p in PAIRS
        for r in names.ROLES
    ]
    targets = [{"target": names.pair_target(p), "pair": p} for p in PAIRS]
    return {
        "envs": _results([(i["env_file"].rsplit("/", 1)[-1] in changed, i) for i in insts]),
        "units": _results([(i["inst"]["unit"] in changed, i) for i in insts]),
        "targets": _results([(t["target"] in changed, t) for t in targets]),
    }


def _plan(
    changed: set[str] | None = None,
    *,
    venv_changed: bool = False,
    pending: list[str] | None = None,
    restart: bool = True,
) -> list[dict[str, Any]]:
    return converge.changed_pairs(
        [{"pair": p, "target": names.pair_target(p), "units": []} for p in PAIRS],
        host="h1",
        layout=LAYOUT,
        venv_changed=venv_changed,
        pending=pending or [],
        restart=restart,
        **_registered(changed or set()),
    )


def test_changed_files_name_their_pair_in_task_order() -> None:
    changed = _plan(
        {"pd0-decode.env", names.engine_unit("pd0", "prefill"), names.pair_target("pd2")}
    )
    assert changed == [
        {
            "pair": "pd0",
            "target": names.pair_target("pd0"),
            "id": "h1/pd0",
            "reasons": ["/etc/pdstack/pd0-decode.env", f"{UNITS}/pdstack-pd0-prefill.service"],
        },
        {
            "pair": "pd2",
            "target": names.pair_target("pd2"),
            "id": "h1/pd2",
            "reasons": [f"{UNITS}/pdstack-pd2.target"],
        },
    ]
    assert converge.restart_plan(changed, restart=True) == [
        f"restart h1/pd0: /etc/pdstack/pd0-decode.env, {UNITS}/pdstack-pd0-prefill.service",
        f"restart h1/pd2: {UNITS}/pdstack-pd2.target",
    ]


def test_a_new_venv_changes_every_pair_after_its_files() -> None:
    changed = _plan({"pd1-prefill.env"}, venv_changed=True)
    assert [c["pair"] for c in changed] == PAIRS
    venv = f"the engine venv ({names.VENV})"
    assert changed[1]["reasons"] == ["/etc/pdstack/pd1-prefill.env", venv]
    assert converge.restart_plan(changed, restart=False)[0] == f"restart pending h1/pd0: {venv}"


@pytest.mark.parametrize("restart", [True, False])
def test_a_pending_marker_is_a_reason_only_when_restarts_are_on(restart: bool) -> None:
    marker = names.restart_pending("pd1")
    changed = _plan(pending=[marker], restart=restart)
    if restart:  # its files no longer change: the marker is what restarts it
        assert converge.restart_plan(changed, restart) == [
            f"restart h1/pd1: restart pending ({marker})"
        ]
    else:  # still pending: nothing new to say, the marker stays as it is
        assert changed == []


def test_a_pending_pair_whose_files_changed_again_lists_both() -> None:
    marker = names.restart_pending("pd0")
    (pd0,) = _plan({names.pair_target("pd0")}, pending=[marker])
    assert pd0["reasons"] == [f"{UNITS}/pdstack-pd0.target", f"restart pending ({marker})"]


def test_nothing_changed_restarts_nothing() -> None:
    assert _plan() == []
    assert converge.restart_plan([], restart=True) == []
    assert converge.running_pairs([], []) == []


def test_only_running_pairs_restart() -> None:
    changed = _plan(venv_changed=True)
    # systemctl is-active prints a line per target, in the order given.
    running = converge.running_pairs(changed, ["active", "inactive", "activating"])
    assert [c["id"] for c in running] == ["h1/pd0"]
    # The is-active task skipped (nothing changed): no lines, nothing running.
    assert converge.running_pairs(changed, []) == []


def test_changed_targets_are_what_check_mode_cannot_start() -> None:
    reg = _registered({names.pair_target("pd1")})
    assert converge.changed_targets(reg["targets"]) == [names.pair_target("pd1")]
    assert converge.changed_targets(_registered(set())["targets"]) == []


def test_firewall_sources_from_addresses_names_and_allowed_networks() -> None:
    hosts = ["gw", "mon", "gpu1", "gpu2"]
    given = converge.firewall_given(
        hosts, ["10.0.0.2", "", "10.0.0.11", "10.0.0.2"], ["192.0.2.0/24", "2001:db8::/32", "mon"]
    )
    # An address, else the name; each once, in inventory order, then the allowed ones.
    assert given == ["10.0.0.2", "mon", "10.0.0.11", "192.0.2.0/24", "2001:db8::/32"]
    assert converge.firewall_names(given) == ["mon"]
    # `getent ahosts mon`: an address first on each line, repeated per socket type.
    resolved = [["127.0.0.1       STREAM mon", "127.0.0.1       DGRAM", "::1  RAW"]]
    assert converge.firewall_sources(given, resolved) == [
        "10.0.0.11", "10.0.0.2", "127.0.0.1", "192.0.2.0/24", "2001:db8::/32", "::1",
    ]  # fmt: skip
    assert converge.firewall_sources(["10.0.0.1"], []) == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("started", "mtimes", "old"),
    [
        ("@1764557940", [1_764_558_000.0], True),  # pdctl reinstalled after it started
        ("@1764558060\n", [1_764_558_000.0], False),  # restarted since (a second run)
        ("", [1_764_558_000.0], False),  # not running: nothing to restart
        ("@1764558000", [], False),  # no venv yet (--check on a fresh host)
        ("n/a", [1.0], False),
    ],
)
def test_a_unit_started_before_its_venv_changed_runs_old_code(
    started: str, mtimes: list[float], old: bool
) -> None:
    assert converge.runs_old_code(started, mtimes) is old


def test_register_changed_when_a_worker_was_added_or_removed() -> None:
    def out(*workers: dict[str, str]) -> str:
        return json.dumps([{"host": f"gw{i}", "workers": w} for i, w in enumerate(workers)])

    assert not converge.registered_changed(out({"http://a": "bound"}, {}))
    assert converge.registered_changed(out({"http://a": "bound"}, {"http://b": "added"}))
    assert converge.registered_changed(out({"http://a": "removed"}))
    assert not converge.registered_changed(out({"http://a": "draining"}))


def test_the_plugin_gives_the_roles_every_filter() -> None:
    plugin = filter_plugin().FilterModule().filters()
    for name, fn in converge.FILTERS.items():
        assert plugin[name] is fn, name


def test_listen_ports_of_engine_gateway_and_store_hosts(tmp_path: Path) -> None:
    dep = filter_plugin().pdstack_deployment(str(two_gateways_inventory(tmp_path)), str(REFERENCE))
    gw, etcd = dep["gateway"], dep["etcd"]
    first, second = dep["hosts"]
    assert set(gw["urls"]) == {first, second} and list(etcd["members"]) == [first]
    store = [etcd["client_port"], etcd["peer_port"], etcd["metrics_port"]]
    for host, more in ((first, store), (second, [])):
        engines = dep["hosts"][host]["ports"]
        assert converge.listen_ports(dep, host) == [
            *engines, gw["port"], gw["metrics_port"], *more,
        ]  # fmt: skip
    assert converge.listen_ports(dep, "monitoring-1") == []


def test_port_clashes_are_the_ports_held_by_other_units() -> None:
    listeners = [
        "30000 pdstack-pd0-prefill.service users:((python,pid=7,fd=3))",
        "30001 nginx.service users:((nginx,pid=8,fd=6))",
        "22 ssh.service users:((sshd,pid=9,fd=3))",
        "8998 unknown ",
        "9000 unknown",
    ]
    assert converge.port_clashes(listeners, [30000, 30001, 8998, 9000], "pdstack-") == [
        "30001 nginx.service users:((nginx,pid=8,fd=6))",
        "8998 unknown ",
        "9000 unknown",
    ]
    assert converge.port_clashes([], [30000], "pdstack-") == []


def test_the_preflight_role_checks_the_ports_of_its_host(tmp_path: Path) -> None:
    """Through real Ansible and the role's vars file: the filter plugin's deployment in, the
    gateway host's ports out."""
    dep = filter_plugin().pdstack_deployment(str(two_gateways_inventory(tmp_path)), str(REFERENCE))
    second = list(dep["hosts"])[1]
    ports = role_expression(
        tmp_path,
        ROOT / "roles" / "pdstack_preflight" / "vars" / "main.yml",
        {"__pdstack_deployment": dep, "inventory_hostname": second},
        "_pdstack_preflight_ports",
    )
    assert ports == converge.listen_ports(dep, second)
    assert dep["gateway"]["port"] in ports


def test_no_jinja_statements_in_the_roles_yaml() -> None:
    """Logic that needs a loop, a `set` or a branch block is Python (here, through the filter
    plugin), not Jinja in vars, tasks, handlers or defaults; templates may have them."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted(ROOT.glob("roles/*/*/*.yml"))
        if path.parent.name != "templates"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "{%" in line
    ]
    assert found == []


def test_the_derived_settings_of_the_roles() -> None:
    # The wait stays within its timeout: whole tries, rounded up.
    each = {"timeout": 5, "delay": 5}
    assert [converge.ready_retries(t, each) for t in (0, "10", 11, 900)] == [0, 1, 2, 90]
    assert converge.pki_dir("", "/srv/inv/pki", "/srv/inv") == "/srv/inv/pki"
    assert converge.pki_dir("/etc/pki", "/srv/inv/pki", "/srv/inv") == "/etc/pki"
    assert converge.pki_dir("keys", "/srv/inv/pki", "/srv/inv") == "/srv/inv/keys"
    assert converge.controller_address("192.0.2.9 51234 22") == ["192.0.2.9"]
    assert converge.controller_address("") == []


def test_the_store_and_gateway_roles_derive_their_values_through_the_filters(
    tmp_path: Path,
) -> None:
    """Through real Ansible and the roles' vars files: the firewall's monitoring sources (an
    address, else the name), the controller, the PKI folder and the waits' tries."""
    etcd = role_expression(
        tmp_path,
        ROOT / "roles" / "pdstack_etcd" / "vars" / "main.yml",
        {
            "__pdstack_deployment": {"etcd": {"pki_dir": "/srv/inv/pki"}, "layout": {}},
            "pdstack_etcd_pki_dir": "keys",
            "ansible_env": {"SSH_CLIENT": "192.0.2.9 51234 22"},
            "pdstack_etcd_ready_timeout": 60,
        },
        "[_pdstack_etcd_monitoring, _pdstack_etcd_controller, _pdstack_etcd_pki,"
        " _pdstack_etcd_ready_retries]",
        inventory="[monitoring]\nlocalhost\nmon2 ansible_host=10.0.0.7\n",
    )
    assert etcd == [["localhost", "10.0.0.7"], ["192.0.2.9"], f"{tmp_path}/keys", 9]
    gateway = role_expression(
        tmp_path,
        ROOT / "roles" / "pdstack_gateway" / "vars" / "main.yml",
        {"__pdstack_deployment": {}, "pdstack_gateway_ready_timeout": "900"},
        "_pdstack_gateway_ready_retries",
    )
    assert gateway == 90
