"""A profile written with pairs renders what it did before groups existed, byte for byte:
every unit, env file and command line, the topology file and the gateway's line. Upgrading
pdstack then changes no file on a host and restarts nothing.

The expected text in tests/data/pairs-rendered/ was written by `rendering` run against the
code before groups (commit d3af11d); regenerate it only for a deliberate change of output:
`python -m tests.unit.test_pairs_unchanged` (then read the diff)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pdctl import render, topology
from pdctl.spec import load_deployment

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "tests" / "data" / "pairs-rendered"
# Profile -> the [pd_hosts] of its inventory (two hosts: the names repeat per host).
CASES = {"reference": ["gpu-node-1"], "sim": ["node-1", "node-2"], "sim-fleet": ["n1", "n2"]}


def rendering(profile: str, hosts: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory.ini"
        lines = ["[pd_hosts]", *hosts, "[router]", hosts[0], "[etcd]", hosts[0], "[all:vars]"]
        lines.append(f"pdstack_profile={ROOT / 'deploy' / 'profiles' / profile}.yml")
        inventory.write_text("\n".join(lines) + "\n")
        dep = load_deployment(inventory)
        out = []
        for inst in dep.instances:
            r = render.render_instance(inst, dep)
            out += [f"## {inst.id} {inst.unit}", r.unit, f"## {r.env_file}", r.env_text]
        out += ["## topology", topology.dump(topology.from_deployment(dep))]
        out += ["## gateway", *render.gateway_command_lines(dep, api_key=True)]
        return "\n".join(out) + "\n"


@pytest.mark.parametrize("profile", CASES)
def test_pairs_profile_renders_as_before_groups(profile: str) -> None:
    expected = (EXPECTED / f"{profile}.txt").read_text()
    assert rendering(profile, CASES[profile]) == expected


if __name__ == "__main__":
    for name, hosts in CASES.items():
        (EXPECTED / f"{name}.txt").write_text(rendering(name, hosts))
