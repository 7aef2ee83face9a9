"""pdctl.ops.source: pair names across hosts."""

from __future__ import annotations

import pytest

from pdctl.errors import PdctlError
from pdctl.ops.source import Source
from tests.unit.ops_fakes import (
    topo,
)


def test_pair_names_across_hosts() -> None:
    src = Source(topo(("node-a", "node-b")), None)
    assert [p.id for p in src.select(("node-b/pd1",), False)] == ["node-b/pd1"]
    assert len(src.select((), True)) == 4
    with pytest.raises(PdctlError, match="on several hosts; use one of: node-a/pd0, node-b/pd0"):
        src.select(("pd0",), False)
    with pytest.raises(PdctlError, match="unknown instance 'pd7-decode'; valid instances:"):
        src.instance("pd7-decode")
