"""xPyD groups in the profile: loaded into the deployment beside pairs, named, rendered, and
written into the topology file (docs/spec.md, "layout")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl import names, topology
from pdctl.exporter.targets import host_targets
from pdctl.render import environment, launch_args, render_instance
from pdctl.spec import Deployment, Role
from tests.conftest import filter_plugin

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]


def two_p_one_d(profile: dict[str, Any]) -> dict[str, Any]:
    """The sim profile with its pair and a host-local 2P1D group `g0` on four more GPUs."""
    profile["hardware"] |= {"gpu_count": 5, "numa_gpus": {0: [0, 1, 2, 3, 4]}}
    profile["layout"]["groups"] = [
        {
            "name": "g0",
            "prefill": [
                {"numa_node": 0, "gpus": [2], "port": 30010, "bootstrap_port": 9010},
                {"numa_node": 0, "gpus": [3], "port": 30012, "bootstrap_port": 9012},
            ],
            "decode": [{"numa_node": 0, "gpus": [4], "port": 30011}],
        }
    ]
    return profile


def test_a_group_beside_a_pair(load: Load, shipped: Shipped) -> None:
    dep = load(two_p_one_d(shipped("sim")), hosts=["node-1", "node-2"])
    pair, group = dep.groups()[:2]
    assert (pair.id, pair.is_pair, group.id, group.is_pair) == (
        "node-1/pd0", True, "node-1/g0", False
    )  # fmt: skip
    assert [i.name for i in pair.instances] == ["pd0-prefill", "pd0-decode"]
    assert [i.name for i in group.instances] == ["g0-prefill0", "g0-prefill1", "g0-decode0"]
    assert [i.unit for i in group.instances] == [
        "pdstack-g0-prefill0.service", "pdstack-g0-prefill1.service", "pdstack-g0-decode0.service"
    ]  # fmt: skip
    assert {i.pair_target for i in group.instances} == {"pdstack-g0.target"}
    assert [g.id for g in dep.groups()] == ["node-1/pd0", "node-1/g0", "node-2/pd0", "node-2/g0"]


def test_group_members_render_their_own_ports_and_files(load: Load, shipped: Shipped) -> None:
    dep = load(two_p_one_d(shipped("sim")))
    p0, p1, d0 = dep.groups()[1].instances
    for inst, bootstrap in ((p0, "9010"), (p1, "9012")):
        args = launch_args(inst, dep)
        assert args[args.index("--disaggregation-bootstrap-port") + 1] == bootstrap
    assert "--disaggregation-bootstrap-port" not in launch_args(d0, dep)
    # The decode's cross-group counter knows both prefills of its group, and only them.
    assert environment(d0, dep)["PDSIM_PAIR_PARTNER"] == "gpu-node-1:9010,gpu-node-1:9012"
    r = render_instance(p1, dep)
    assert r.env_file == "/etc/pdstack/g0-prefill1.env"
    assert "(group g0, NUMA 0, GPUs 3)" in r.unit
    assert "PartOf=pdstack-g0.target" in r.unit and "OnFailure=pdstack-recover@g0.service" in r.unit
    assert "(pair pd0, NUMA 0, GPUs 0)" in render_instance(dep.instances[0], dep).unit


def test_topology_lists_groups_apart_from_pairs(
    load: Load, shipped: Shipped, tmp_path: Path
) -> None:
    dep = load(two_p_one_d(shipped("sim")))
    topo = topology.from_deployment(dep)
    assert [p.name for p in topo.pairs] == ["pd0"]
    (g,) = topo.groups
    assert (g.name, g.target) == ("g0", "pdstack-g0.target")
    assert g.prefill == ["gpu-node-1/g0-prefill0", "gpu-node-1/g0-prefill1"]
    assert g.decode == ["gpu-node-1/g0-decode0"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology.dump(topo))
    assert topology.read(path) == topo
    # A pairs-only deployment writes no groups key (tests/unit/test_pairs_unchanged.py).
    assert "groups" not in topology.dump(topology.from_deployment(load(shipped("sim"))))


def test_a_one_by_one_group_is_a_pair_to_the_topology(load: Load, shipped: Shipped) -> None:
    profile = shipped("sim")
    pair = profile["layout"].pop("pairs")[0]
    profile["layout"]["groups"] = [
        {"name": "g1", "prefill": [pair["prefill"]], "decode": [pair["decode"]]}
    ]
    topo = topology.from_deployment(load(profile))
    assert [(p.name, p.prefill, p.decode) for p in topo.pairs] == [
        ("g1", "gpu-node-1/g1-prefill0", "gpu-node-1/g1-decode0")
    ]
    assert topo.groups == []


def test_stale_group_members_are_found_and_removed() -> None:
    found = [
        names.pair_target("g0"),
        names.engine_unit("g0", "prefill", 0),
        names.engine_unit("g0", "prefill", 1),
        names.engine_unit("g0", "decode", 0),
        names.engine_unit("pd0", "decode"),
    ]
    assert names.pair_of_unit(names.engine_unit("g0", "prefill", 1)) == "g0"
    stale = names.stale_pairs(found, keep=["pd0"])
    assert stale["pairs"] == ["g0"]
    assert stale["stop"][0] == "pdstack-g0.target"
    for member in ("g0-prefill0", "g0-prefill1", "g0-decode0"):
        assert f"/etc/systemd/system/pdstack-{member}.service" in stale["files"]
        assert f"/etc/pdstack/{member}.env" in stale["files"]
    assert "/etc/systemd/system/pdstack-g0.target" in stale["files"]


def test_roles_are_numbered_apart(load: Load, shipped: Shipped) -> None:
    dep = load(two_p_one_d(shipped("sim")))
    group = dep.groups()[1]
    assert [i.member for i in group.prefills] == [0, 1]
    assert [(i.role, i.member) for i in group.decodes] == [(Role.DECODE, 0)]


# ----- refused at load: one line naming the group, the member and the fix, nothing written -----
def _group(**changes: Any) -> dict[str, Any]:
    group = two_p_one_d({"hardware": {}, "layout": {}})["layout"]["groups"][0]
    return {**group, **changes}


P0 = {"numa_node": 0, "gpus": [2], "port": 30010, "bootstrap_port": 9010}
D0 = {"numa_node": 0, "gpus": [4], "port": 30011}
REFUSED = {
    "no prefill": (
        {"groups": [_group(prefill=[])]},
        "layout.groups[0]: group 'g0' has no prefill: a group needs at least one prefill and one "
        "decode; add one under prefill",
    ),
    "no decode": ({"groups": [_group(decode=[])]}, "group 'g0' has no decode"),
    "duplicate group name": (
        {"groups": [_group(), _group()]},
        "layout.groups: duplicate group name 'g0'",
    ),
    "pair and group share a name": (
        {"groups": [_group(name="pd0")]},
        "layout: 'pd0' names both a pair and a group: rename one",
    ),
    "no pairs and no groups": ({"pairs": [], "groups": []}, "layout: no pairs and no groups"),
    "prefill without bootstrap port": (
        {"groups": [_group(prefill=[P0, {**P0, "bootstrap_port": None}])]},
        "group 'g0' prefill[1]: bootstrap_port is required",
    ),
    "decode with bootstrap port": (
        {"groups": [_group(decode=[{**D0, "bootstrap_port": 9000}])]},
        "group 'g0' decode[0]: bootstrap_port is not used: only a prefill serves bootstrap",
    ),
    "host on some members only": (
        {"groups": [_group(decode=[{**D0, "host": "node-2"}])]},
        "layout.groups[0]: group 'g0' prefill[0] has no host while decode[0] names one: give "
        "every member of the group a host (it then exists once in the fleet), or none",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_bad_group_is_refused_in_one_line(
    case: str, pdctl: Callable[..., Any], write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    layout, expected = REFUSED[case]
    profile = two_p_one_d(shipped("sim"))
    profile["layout"] |= layout
    inventory = write_deployment(profile)
    run = pdctl("render", "-i", str(inventory))
    assert run.exit_code == 2 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"Error: {inventory.parent / 'profile.yml'}: ")
    assert expected in line, line


def test_the_roles_get_a_group_as_one_unit(
    write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    """filter_plugins/pdstack.py: one target with every member's unit (the roll, the stale
    units, the recovery unit take it as they take a pair), every member's ports."""
    inventory = write_deployment(two_p_one_d(shipped("sim")))
    host = filter_plugin().pdstack_deployment(str(inventory), "profile.yml")["hosts"]["gpu-node-1"]
    assert host["pairs"][1] == {
        "pair": "g0",
        "target": "pdstack-g0.target",
        "units": [
            names.engine_unit("g0", r, n)
            for r, n in (("prefill", 0), ("prefill", 1), ("decode", 0))
        ],
    }
    assert {9010, 9012, 30010, 30011, 30012} <= set(host["ports"])
    (member,) = [i for i in host["instances"] if i["inst"]["name"] == "g0-prefill1"]
    assert (member["inst"]["kind"], member["inst"]["group"]) == ("group", "g0")
    assert member["env_file"] == "/etc/pdstack/g0-prefill1.env"


def test_the_exporter_canaries_every_member_of_a_group(load: Load, shipped: Shipped) -> None:
    dep = load(two_p_one_d(shipped("sim")))
    pair, group = host_targets(topology.from_deployment(dep), "gpu-node-1", {}).pairs
    (p0, p1, d0) = (i.url for i in dep.groups()[1].instances)
    assert pair.pair == "gpu-node-1/pd0" and len(pair.legs) == 1
    assert group.pair == "gpu-node-1/g0"
    assert group.legs == ((p0, d0, 9010), (p1, d0, 9012))


def test_the_exporter_states_each_roles_members_of_its_hosts_groups(
    load: Load, shipped: Shipped
) -> None:
    """pdstack_group_members, the count PDGroupMembersDown holds the engines' `up` against."""
    topo = topology.from_deployment(load(two_p_one_d(shipped("sim")), hosts=["node-1", "node-2"]))
    assert host_targets(topo, "node-1", {}).members == {
        ("node-1/pd0", "prefill"): 1,
        ("node-1/pd0", "decode"): 1,
        ("node-1/g0", "prefill"): 2,
        ("node-1/g0", "decode"): 1,
    }
    assert set(host_targets(topo, "node-2", {}).members) == {
        ("node-2/pd0", "prefill"), ("node-2/pd0", "decode"),
        ("node-2/g0", "prefill"), ("node-2/g0", "decode"),
    }  # fmt: skip
