"""The store in the spec: the [etcd] group, the profile's etcd section, the topology's coord,
and the refused keys of the old lock server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl import names, topology
from pdctl.errors import SpecError
from pdctl.ops import source
from pdctl.spec import Deployment, load_deployment

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]


@pytest.mark.parametrize(
    ("key", "instead"), [("lock_port", "etcd.client_port"), ("lock_ttl_s", "etcd.lock_ttl_s")]
)
def test_the_old_lock_keys_are_refused_naming_their_replacement(
    key: str, instead: str, load: Load, shipped: Shipped
) -> None:
    profile = shipped("reference")
    profile["router"][key] = 30
    with pytest.raises(SpecError) as e:
        load(profile)
    assert e.value.key == "router"
    assert f"router.{key} is gone" in e.value.message and instead in e.value.message


def test_the_store_ports_must_differ(load: Load, shipped: Shipped) -> None:
    profile = shipped("reference")
    profile["etcd"] = {"peer_port": 2379}
    with pytest.raises(SpecError, match="must differ") as e:
        load(profile)
    assert e.value.key == "etcd"


def test_defaults(load: Load, shipped: Shipped) -> None:
    etcd = load(shipped("reference")).profile.etcd
    assert (etcd.client_port, etcd.peer_port, etcd.metrics_port) == (2379, 2380, 2381)
    assert (etcd.lock_ttl_s, etcd.gateway_ttl_s) == (15.0, 15.0)


def _inventory(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "profile.yml").write_text(
        (Path(__file__).parents[2] / "deploy/profiles/reference.yml").read_text()
    )
    inv = tmp_path / "inventory.ini"
    inv.write_text(
        "[pd_hosts]\ngpu1 ansible_host=10.0.0.11\ngpu2 ansible_host=10.0.0.12\n"
        "[router]\ngpu1\n[etcd]\ngpu1\ngpu2\nstore3 ansible_host=10.0.0.13\n"
        f"[all:vars]\npdstack_profile=profile.yml\n{extra}"
    )
    return inv


def test_the_etcd_group_resolves_in_inventory_order_with_addresses(tmp_path: Path) -> None:
    dep = load_deployment(_inventory(tmp_path))
    assert [(m.name, m.address) for m in dep.etcd] == [
        ("gpu1", "10.0.0.11"), ("gpu2", "10.0.0.12"), ("store3", "10.0.0.13"),
    ]  # fmt: skip
    assert dep.inventory_hosts == ["gpu1", "gpu2", "store3"]
    assert dep.pki_dir == tmp_path / "pki"


def test_a_missing_etcd_group_loads_for_the_lint_rule_to_refuse(
    write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    dep = load_deployment(write_deployment(shipped("reference"), etcd=""))
    assert dep.etcd == []
    assert topology.from_deployment(dep).coord is None


def test_the_host_topology_names_the_installed_tls_files(tmp_path: Path) -> None:
    coord = topology.from_deployment(load_deployment(_inventory(tmp_path))).coord
    assert coord == topology.TopologyCoord(
        endpoints=["https://10.0.0.11:2379", "https://10.0.0.12:2379", "https://10.0.0.13:2379"],
        ca_file=names.ETCD_CA,
        cert_file=names.ETCD_CLIENT_CERT,
        key_file=names.ETCD_CLIENT_KEY,
        lock_ttl_s=15.0,
        gateway_ttl_s=15.0,
    )


@pytest.mark.parametrize(
    ("var", "where"), [("", "pki"), ("pdstack_etcd_pki_dir=secrets/etcd\n", "secrets/etcd")]
)
def test_the_controller_uses_its_pki_directory(tmp_path: Path, var: str, where: str) -> None:
    src = source.load(Path("/nonexistent"), _inventory(tmp_path, var), None)
    coord = src.topology.coord
    assert coord is not None
    pki = tmp_path / where
    assert (coord.ca_file, coord.cert_file, coord.key_file) == (
        str(pki / "ca.crt"), str(pki / "controller.crt"), str(pki / "controller.key"),
    )  # fmt: skip
    assert coord.endpoints[0] == "https://10.0.0.11:2379"
