"""The topology file: built from the deployment, written, read back; bad files are SpecErrors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdctl import names, topology
from pdctl.errors import PdctlError, SpecError
from pdctl.spec import Role, load_deployment
from tests.conftest import two_gateways_inventory

ROOT = Path(__file__).resolve().parents[2]
TWO_HOSTS = ROOT / "deploy" / "examples" / "two-hosts.ini"


def test_round_trip(tmp_path: Path) -> None:
    topo = topology.from_deployment(load_deployment(TWO_HOSTS))
    path = tmp_path / "topology.yaml"
    path.write_text(topology.dump(topo))
    assert topology.read(path) == topo
    assert path.read_text().startswith("# Written by site.yml")


def test_contents_span_every_host() -> None:
    topo = topology.from_deployment(load_deployment(TWO_HOSTS))
    assert [(p.host, p.name, p.target) for p in topo.pairs] == [
        ("gpu-node-1", "pd0", "pdstack-pd0.target"),
        ("gpu-node-2", "pd0", "pdstack-pd0.target"),
    ]
    assert topo.pairs[1].prefill == "gpu-node-2/pd0-prefill"
    node2 = topo.on_host("gpu-node-2")
    assert [(i.role, i.url, i.unit) for i in node2] == [
        (Role.PREFILL, "http://10.0.0.12:30000", "pdstack-pd0-prefill.service"),
        (Role.DECODE, "http://10.0.0.12:30001", "pdstack-pd0-decode.service"),
    ]
    assert node2[0].bootstrap_port == 8998 and node2[1].bootstrap_port is None
    (gateway,) = topo.gateways
    assert gateway.url == "http://10.0.0.11:8000"
    assert gateway.metrics_url == "http://10.0.0.11:29000/metrics"
    assert gateway.unit == names.GATEWAY_UNIT


def test_every_router_host_is_a_gateway(tmp_path: Path) -> None:
    topo = topology.from_deployment(load_deployment(two_gateways_inventory(tmp_path)))
    assert [(g.host, g.url, g.metrics_url) for g in topo.gateways] == [
        ("gpu-node-1", "http://10.0.0.11:8000", "http://10.0.0.11:29000/metrics"),
        ("gpu-node-2", "http://10.0.0.12:8000", "http://10.0.0.12:29000/metrics"),
    ]
    assert topo.gateway("gpu-node-2") == topo.gateways[1]
    with pytest.raises(
        PdctlError, match="no gateway on 'gpu-node-3'; gateways run on: gpu-node-1, gpu-node-2"
    ):
        topo.gateway("gpu-node-3")
    path = tmp_path / "topology.yaml"
    path.write_text(topology.dump(topo))
    assert topology.read(path) == topo


def test_a_file_without_gateways_has_its_router_as_only_gateway(tmp_path: Path) -> None:
    """Files site.yml wrote before gateways existed stay readable."""
    topo = topology.from_deployment(load_deployment(TWO_HOSTS))
    data = yaml.safe_load(topology.dump(topo))
    (data["router"],) = data.pop("gateways")
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    assert topology.read(path) == topo


def test_a_file_naming_its_first_gateway_router_too_stays_readable(tmp_path: Path) -> None:
    """Files site.yml wrote while the first gateway was special: `router` beside `gateways`."""
    topo = topology.from_deployment(load_deployment(two_gateways_inventory(tmp_path)))
    data = yaml.safe_load(topology.dump(topo))
    assert "router" not in data
    data["router"] = data["gateways"][0]
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    assert topology.read(path) == topo


def test_a_file_without_any_gateway_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(topology.dump(topology.from_deployment(load_deployment(TWO_HOSTS))))
    data["gateways"] = []
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="gateways"):
        topology.read(path)


def test_a_file_written_for_the_former_lock_server_stays_readable(tmp_path: Path) -> None:
    topo = topology.from_deployment(load_deployment(two_gateways_inventory(tmp_path)))
    data = yaml.safe_load(topology.dump(topo))
    data["lock"] = {"host": "gpu-node-1", "url": "http://10.0.0.11:8790", "ttl_s": 30.0}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    assert topology.read(path) == topo


def test_gateways_must_start_with_the_router(tmp_path: Path) -> None:
    """A file in the earlier format, whose `router` is not its first gateway, is no file
    site.yml wrote."""
    topo = topology.from_deployment(load_deployment(two_gateways_inventory(tmp_path)))
    data = yaml.safe_load(topology.dump(topo))
    data["router"] = data["gateways"][0]
    data["gateways"].reverse()
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="gateways must start with router"):
        topology.read(path)


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (None, "", "cannot read"),
        ("pairs: [\n", "", "malformed YAML"),
        ("- a\n", "", "must be a YAML mapping"),
        ("version: 99\n", "version", "expected 1"),
        ("version: 1\nmodel: m\n", "engine", "Field required"),
    ],
)
def test_bad_files(tmp_path: Path, text: str | None, where: str, message: str) -> None:
    path = tmp_path / "topology.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SpecError, match=message) as err:
        topology.read(path)
    assert err.value.key == where and err.value.file == str(path)
