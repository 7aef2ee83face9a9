"""The harness's free ports: a stack asks for several before any is listening, so no two
handed out by one process may be the same (a 3-member etcd once got one peer port twice);
none lies in the kernel's ephemeral range, where an outgoing connection may take it first;
xdist workers draw from disjoint slices."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from pdctl.testing import stack
from pdctl.testing.stack import free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(free_port() < low for _ in range(50))


def test_a_port_in_use_is_skipped() -> None:
    taken = free_port() + 1  # the next one the cursor reaches
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        assert free_port() != taken


def test_xdist_workers_draw_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    for worker in ("", "gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        starts.append(stack._slice_start())
    ordered = sorted(starts)
    assert all(b - a >= stack.PORT_SLICE for a, b in itertools.pairwise(ordered))
