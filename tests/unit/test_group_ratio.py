"""benchmarks/group_ratio.py's layouts: the same 4 GPUs of one host, valid profiles, each
engine launched as its unit would be (pdctl.testing's SimProc.rendered and deployed)."""

from __future__ import annotations

from itertools import count
from pathlib import Path
from types import ModuleType

import pytest

from pdctl.testing.localproc import LocalGroup, LocalPair, deployed
from tests.conftest import benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return benchmark("group_ratio")


@pytest.mark.parametrize(
    ("layout", "shapes"),
    [
        ("2x1P1D", [("pd0", 1, 1), ("pd1", 1, 1)]),
        ("3P1D", [("g0", 3, 1)]),
        ("1P3D", [("g0", 1, 3)]),
    ],
)
def test_each_layout_is_a_valid_profile_on_the_same_four_gpus(
    bench: ModuleType, layout: str, shapes: list[tuple[str, int, int]], tmp_path: Path
) -> None:
    dep = bench.load_layout(
        bench.ratio_profile(bench.LAYOUTS[layout], count(20000)), tmp_path / "d"
    )
    groups = dep.groups()
    assert [(g.name, len(g.prefills), len(g.decodes)) for g in groups] == shapes
    assert all(g.is_pair for g in groups) == (layout == "2x1P1D")  # 1P1D written as pairs
    gpus = [gpu for i in dep.instances for gpu in i.gpus]
    assert sorted(gpus) == [0, 1, 2, 3] and {i.host for i in dep.instances} == {"local"}

    units = deployed(dep, tmp_path)
    kind = LocalPair if layout == "2x1P1D" else LocalGroup
    assert all(isinstance(u, kind) for u in units)
    for g, u in zip(groups, units, strict=True):
        sims = {i.url: sim for i, (_, _, sim) in zip(g.instances, u.members(), strict=True)}
        assert list(sims) == [sim.url for sim in sims.values()]
        partners = ",".join(f"127.0.0.1:{p.bootstrap_port}" for p in g.prefills)
        for d in g.decodes:
            sim = sims[d.url]
            # The shipped sim profile's decode tuning and knobs, and its group's prefills.
            assert sim.argv[sim.argv.index("--max-running-requests") + 1] == "64"
            assert sim.env["PDSIM_PAIR_PARTNER"] == partners
            assert sim.env["PDSIM_STARTUP_DELAY_S"] == "2"
        for p in g.prefills:
            assert sims[p.url].bootstrap_port == p.bootstrap_port
