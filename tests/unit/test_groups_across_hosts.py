"""Groups whose members name their hosts: one group in the fleet, its members on those hosts
(docs/spec.md, "Groups across hosts"): loaded, refused, rendered, restarted and watched whole."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pdctl import converge, names, render, topology
from pdctl.cli import status_view
from pdctl.exporter.targets import host_targets
from pdctl.ops import restart
from pdctl.ops.source import Source
from pdctl.ops.status import collect
from pdctl.ops.systemd import ssh_config
from pdctl.spec import Deployment
from tests.conftest import filter_plugin
from tests.prometheus_role import templates
from tests.unit.ops_fakes import FakeGateway, FakeSystemd, fake_ops

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]
HOSTS = ["node-1", "node-2", "node-3"]


def one_p_two_d(profile: dict[str, Any], **group: Any) -> dict[str, Any]:
    """The sim profile's pair on every host, and a 1P2D group g1 on a third pretend GPU of
    each: its prefill on node-1, a decode on node-2 and one on node-3."""
    profile["hardware"] |= {"gpu_count": 3, "numa_gpus": {0: [0, 1, 2]}}
    g1 = {
        "name": "g1",
        "allow_tcp_kv": True,
        "prefill": [
            {"host": "node-1", "numa_node": 0, "gpus": [2], "port": 30010, "bootstrap_port": 9010},
        ],
        "decode": [
            {"host": "node-2", "numa_node": 0, "gpus": [2], "port": 30011},
            {"host": "node-3", "numa_node": 0, "gpus": [2], "port": 30011},
        ],
    }
    profile["layout"]["groups"] = [g1 | group]
    return profile


def test_the_group_exists_once_with_its_members_on_their_hosts(
    load: Load, shipped: Shipped
) -> None:
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    assert [g.id for g in dep.groups()] == ["node-1/pd0", "g1", "node-2/pd0", "node-3/pd0"]
    g1 = dep.groups()[1]
    assert (g1.host, g1.hosts) == (None, HOSTS)
    assert [i.id for i in g1.instances] == [
        "node-1/g1-prefill0", "node-2/g1-decode0", "node-3/g1-decode1"
    ]  # fmt: skip
    # Each host holds its own pair and the members placed there, under the group's names.
    assert [i.name for i in dep.host("node-3").instances] == [
        "pd0-prefill", "pd0-decode", "g1-decode1"
    ]  # fmt: skip
    assert {i.unit for i in g1.decodes} == {names.engine_unit("g1", "decode", 0),
                                            names.engine_unit("g1", "decode", 1)}  # fmt: skip
    assert {i.pair_target for i in g1.instances} == {"pdstack-g1.target"}


def test_a_decode_knows_its_groups_prefill_on_another_host(load: Load, shipped: Shipped) -> None:
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    decode = next(i for i in dep.instances if i.name == "g1-decode1")
    # The sim's cross-group counter: the prefill's address, not its own host's.
    assert render.environment(decode, dep)["PDSIM_PAIR_PARTNER"] == "node-1:9010"
    unit = render.render_instance(decode, dep).unit
    assert "PartOf=pdstack-g1.target" in unit and "OnFailure=pdstack-recover@g1.service" in unit


def test_the_topology_holds_the_group_with_members_on_several_hosts(
    load: Load, shipped: Shipped, tmp_path: Path
) -> None:
    topo = topology.from_deployment(load(one_p_two_d(shipped("sim")), hosts=HOSTS))
    (g1,) = topo.groups  # a 1P2D group, and listed under groups even as 1P1D (below)
    assert (g1.host, g1.name, g1.target) == (None, "g1", "pdstack-g1.target")
    assert g1.decode == ["node-2/g1-decode0", "node-3/g1-decode1"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology.dump(topo))
    assert topology.read(path) == topo
    assert topo.pair_id("node-2", "g1") == "g1" and topo.pair_id("node-2", "pd0") == "node-2/pd0"


def test_a_one_by_one_group_across_hosts_stays_a_group(load: Load, shipped: Shipped) -> None:
    profile = one_p_two_d(shipped("sim"))
    profile["layout"]["groups"][0]["decode"].pop()
    topo = topology.from_deployment(load(profile, hosts=HOSTS))
    assert [p.name for p in topo.pairs] == ["pd0"] * 3
    assert [(g.host, g.name) for g in topo.groups] == [(None, "g1")]


def test_restart_and_recovery_name_it_by_its_id_or_from_any_of_its_hosts(
    load: Load, shipped: Shipped
) -> None:
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    source = Source(topology.from_deployment(dep), dep)
    (g1,) = source.select(("g1",), False)
    assert (g1.id, g1.hosts) == ("g1", HOSTS)
    # The recovery unit on each host names it HOST/g1 (recover@.service.j2).
    for host in HOSTS:
        assert source.select((f"{host}/g1",), False) == [g1]
    with pytest.raises(Exception, match="unknown group 'node-4/g1'"):
        source.select(("node-4/g1",), False)
    assert restart.registrations([g1])[0].pairing == "g1"


def test_a_restart_drives_every_host_of_the_group(load: Load, shipped: Shipped) -> None:
    """Stop on every host before any start (a new decode beside an old prefill is the failure
    stop_pair describes), start each host's target, a marker cleared on every host."""
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    gw = FakeGateway()
    ops = fake_ops(FakeSystemd(), gw, t=topology.from_deployment(dep))
    hosts = {h: FakeSystemd() for h in HOSTS}
    for h, sd in hosts.items():
        sd.host = h
        sd.files[names.restart_pending("g1")] = '{"reason": "x", "since": "now"}'
    ops.systemd_for = hosts.__getitem__
    (g1,) = ops.source.select(("g1",), False)
    plan = "\n".join(restart.plan_lines(ops, [g1]))
    assert "group g1 (pdstack-g1.target)" in plan and "on node-3" in plan
    rep = restart.restart_pair(ops, g1)
    assert rep.ok, rep.error
    assert hosts["node-1"].jobs[0] == (
        "stop", ("pdstack-g1.target", names.engine_unit("g1", "prefill", 0))
    )  # fmt: skip
    assert hosts["node-3"].jobs[0] == (
        "stop", ("pdstack-g1.target", names.engine_unit("g1", "decode", 1))
    )  # fmt: skip
    for sd in hosts.values():
        assert [verb for verb, _ in sd.jobs] == ["stop", "reset-failed", "start"]
        assert sd.jobs[-1] == ("start", ("pdstack-g1.target",))
        assert sd.files == {}
    assert sum("pairing g1" in c for c in gw.calls) == 3
    assert [line.split()[1] for line in rep.lines] == [i.id for i in g1.instances]


def test_status_and_doctor_name_the_group_by_its_id(load: Load, shipped: Shipped) -> None:
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    ops = fake_ops(FakeSystemd(), FakeGateway(), t=topology.from_deployment(dep))
    s = collect(ops, 1)
    assert [p.id for p in s.pairs] == ["node-1/pd0", "g1", "node-2/pd0", "node-3/pd0"]
    assert {i.pair_id for i in s.instances if i.instance.pair == "g1"} == {"g1"}
    assert {i.pair_id for i in s.instances if i.instance.host == "node-3"} == {"node-3/pd0", "g1"}


def test_status_shows_the_group_once_with_its_members_under_their_hosts(
    load: Load, shipped: Shipped
) -> None:
    dep = load(one_p_two_d(shipped("sim")), hosts=HOSTS)
    ops = fake_ops(FakeSystemd(), FakeGateway(), t=topology.from_deployment(dep))
    s = collect(ops, 1)
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    console.print(status_view.view(s))
    lines = console.export_text().splitlines()
    assert lines[0].endswith("3 pairs, 1 group on 3 hosts, 1 gateway")
    assert max(len(line) for line in lines) <= 80
    start = lines.index("across hosts")
    assert lines[start + 1].startswith("  g1  group 1P2D")
    assert [line.strip() for line in lines[start + 2 :] if line.startswith("    node")] == HOSTS
    assert sum(line.lstrip().startswith("decode") for line in lines[start:]) == 2
    (g1,) = [p for p in status_view.to_json(s)["pairs"] if "members" in p]
    assert g1["members"]["decode"] == ("node-2/g1-decode0", "node-3/g1-decode1")


def test_the_exporter_watches_the_group_once_under_its_id(load: Load, shipped: Shipped) -> None:
    topo = topology.from_deployment(load(one_p_two_d(shipped("sim")), hosts=HOSTS))
    first, third = host_targets(topo, "node-1", {}), host_targets(topo, "node-3", {})
    # Its members and its canary on its first prefill's host; its decodes' series carry it.
    assert first.members[("g1", "prefill")] == 1 and first.members[("g1", "decode")] == 2
    assert [p.pair for p in first.pairs] == ["node-1/pd0", "g1"]
    assert len(next(p for p in first.pairs if p.pair == "g1").legs) == 2
    assert ("g1", "decode") not in third.members
    assert [p.pair for p in third.pairs] == ["node-3/pd0"]
    assert [d.pair for d in third.decodes] == ["node-3/pd0", "g1"]
    assert third.gpus[2].pair == "g1"


def test_the_roles_get_its_members_per_host_and_the_peer_ssh(
    write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    inventory = write_deployment(one_p_two_d(shipped("sim")), hosts=HOSTS)
    d = filter_plugin().pdstack_deployment(str(inventory), "profile.yml")
    node2 = d["hosts"]["node-2"]
    assert node2["pairs"][1] == {
        "pair": "g1", "target": "pdstack-g1.target", "id": "g1",
        "units": [names.engine_unit("g1", "decode", 0)],
    }  # fmt: skip
    assert "id" not in node2["pairs"][0]  # a pair's stays HOST/PAIR (converge.changed_pairs)
    assert 30011 in node2["ports"] and 9010 not in node2["ports"]
    assert d["peer_ssh"]["hosts"] == HOSTS and d["peer_ssh"]["addresses"] == HOSTS
    # Only for the peers: ssh to any other host is what it was (root's own keys).
    assert "\nHost node-1 node-2 node-3\n" in d["peer_ssh"]["config_text"]
    assert f"IdentityFile {names.PEER_SSH_KEY}" in d["peer_ssh"]["config_text"]
    assert "StrictHostKeyChecking yes" in d["peer_ssh"]["config_text"]


def test_no_peer_ssh_without_groups_across_hosts(
    write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    inventory = write_deployment(shipped("sim"), hosts=HOSTS)
    assert (
        filter_plugin().pdstack_deployment(str(inventory), "profile.yml")["peer_ssh"]["hosts"] == []
    )


def test_the_roll_restarts_a_group_across_hosts_once() -> None:
    """site.yml's one roll: a group across hosts that changed on two of its hosts is one group
    of the plan, under its bare id, and the ssh settings pdctl gets name both its hosts."""
    g1 = {"pair": "g1", "id": "g1"}
    pd0 = {"pair": "pd0", "id": "node-2/pd0"}
    roll = converge.roll_groups(
        [[], [pd0 | {"host": "node-2"}, g1 | {"host": "node-2"}], [g1 | {"host": "node-3"}]]
    )
    assert roll == [
        {"id": "node-2/pd0", "hosts": ["node-2"]},
        {"id": "g1", "hosts": ["node-2", "node-3"]},
    ]
    assert converge.roll_hosts(roll) == ["node-2", "node-3"]
    changed = converge.changed_pairs(
        [{"pair": "g1", "target": "pdstack-g1.target", "id": "g1"}],
        host="node-2",
        layout={"unit_dir": "/etc/systemd/system", "restart_pending_dir": "/x", "venv": "/v"},
        envs=[], units=[], targets=[], venv_changed=True, pending=[], restart=True,
    )  # fmt: skip
    assert [c["id"] for c in changed] == ["g1"]


def test_known_hosts_lines_name_each_peer_by_its_address() -> None:
    assert converge.known_hosts(["10.0.0.1", "10.0.0.2"], ["AAA1", "AAA2"]) == (
        "10.0.0.1 ssh-ed25519 AAA1\n10.0.0.2 ssh-ed25519 AAA2\n"
    )


# ----- refused at load: one line naming the group, the member and the fix -----
REFUSED = {
    "member on a host not in [pd_hosts]": (
        {"decode": [{"host": "node-9", "numa_node": 0, "gpus": [2], "port": 30011}]},
        "layout.groups[0].decode[0].host: group 'g1' member g1-decode0: host 'node-9' is not in "
        "the inventory's [pd_hosts] group (node-1, node-2, node-3); name one of those",
    ),
    "host on some members only": (
        {"decode": [{"numa_node": 0, "gpus": [2], "port": 30011}]},
        "layout.groups[0]: group 'g1' decode[0] has no host while prefill[0] names one: give "
        "every member of the group a host",
    ),
    "no transfer path across hosts": (
        {"allow_tcp_kv": False},
        "layout.groups[0]: group 'g1' spans node-1, node-2, node-3, and its member g1-prefill0 "
        "on node-1 has no RDMA path: its hardware lists no rdma_nics, so its KV would cross "
        "hosts over TCP; give node-1 one, or set allow_tcp_kv: true on the group",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_bad_group_across_hosts_is_refused_in_one_line(
    case: str, pdctl: Callable[..., Any], write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    change, expected = REFUSED[case]
    inventory = write_deployment(one_p_two_d(shipped("sim"), **change), hosts=HOSTS)
    run = pdctl("render", "-i", str(inventory))
    assert run.exit_code == 2 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"Error: {inventory.parent / 'profile.yml'}: ")
    assert expected in line, line


def test_rdma_on_every_host_is_a_transfer_path(load: Load, shipped: Shipped) -> None:
    profile = one_p_two_d(shipped("sim"), allow_tcp_kv=False)
    profile["hardware"]["rdma_nics"] = ["mlx5_0"]
    profile["engine"]["common"]["env"] = {"UCX_NET_DEVICES": "mlx5_0:1"}
    assert load(profile, hosts=HOSTS).groups()[1].id == "g1"
    profile["engine"]["common"]["env"] = {"UCX_NET_DEVICES": "eth0"}
    with pytest.raises(Exception, match="UCX_NET_DEVICES=eth0 names none of its RDMA NICs"):
        load(profile, hosts=HOSTS)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("allow_tcp_kv", "allow_tcp_kv is for a group whose members name hosts"),
        ("override", "group 'g1' names its members' hosts: move it to the top-level"),
        ("clash", "names a pair or group 'g1', the name of the group across hosts"),
    ],
)
def test_other_misplaced_groups_are_refused(
    where: str, expected: str, load: Load, shipped: Shipped
) -> None:
    profile = one_p_two_d(shipped("sim"))
    g1 = profile["layout"]["groups"][0]
    pair = profile["layout"]["pairs"][0]
    if where == "allow_tcp_kv":  # on a host-local group
        for m in g1["prefill"] + g1["decode"][:1]:
            m.pop("host")
        g1["decode"].pop()
    elif where == "override":
        profile["hosts"] = {"node-2": {"layout": {"groups": [g1]}}}
        profile["layout"].pop("groups")
    else:
        profile["hosts"] = {"node-3": {"layout": {"pairs": [pair | {"name": "g1"}]}}}
    with pytest.raises(Exception, match=expected):
        load(profile, hosts=HOSTS)


def test_prometheus_labels_its_members_with_the_group_id(load: Load, shipped: Shipped) -> None:
    """roles/pdstack_prometheus's file_sd: `pair` joins pd-exporter's pdstack_group_members
    with the engines' `up` (PDGroupMembersDown), so members on every host carry `g1`."""
    topo = topology.from_deployment(load(one_p_two_d(shipped("sim")), hosts=HOSTS))
    text = templates().get_template("engines.json.j2").render(topology=topo.model_dump())
    labels = {t["labels"]["engine"]: t["labels"]["pair"] for t in json.loads(text)}
    assert labels["node-3/g1-decode1"] == labels["node-1/g1-prefill0"] == "g1"
    assert labels["node-3/pd0-decode"] == "node-3/pd0"


def test_pdctl_uses_the_host_to_host_ssh_where_site_yml_installed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery unit cannot read /root/.ssh (ProtectHome=): pdctl takes pdstack's own config
    when it is there, and $PDCTL_SSH_CONFIG over it."""
    peer = tmp_path / "config"
    monkeypatch.delenv("PDCTL_SSH_CONFIG", raising=False)
    assert ssh_config(str(peer)) is None
    peer.write_text(render.peer_ssh_config(["10.0.0.1"]))
    assert ssh_config(str(peer)) == str(peer)
    monkeypatch.setenv("PDCTL_SSH_CONFIG", "/fleet/ssh_config")
    assert ssh_config(str(peer)) == "/fleet/ssh_config"
