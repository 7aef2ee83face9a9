"""The harness's free ports: a stack asks for several before any is listening, so no two
handed out by one process may be the same (a 3-member etcd once got one peer port twice)."""

from __future__ import annotations

from pdctl.testing.stack import free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
