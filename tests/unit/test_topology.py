"""The topology file: built from the deployment, written, read back; bad files are SpecErrors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl import names, topology
from pdctl.errors import SpecError
from pdctl.spec import Role, load_deployment

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
    assert topo.router.url == "http://10.0.0.11:8000"
    assert topo.router.metrics_url == "http://10.0.0.11:29000/metrics"
    assert topo.router.unit == names.GATEWAY_UNIT


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
