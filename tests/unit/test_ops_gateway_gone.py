"""Gateways that are gone (issue 19, item 4), over fakes: a restart reads the gateways'
liveness keys once; a gateway whose host holds no key and takes no connection is named once
and not contacted again in that pair's restart (a powered-off host costs no connect timeout
at each step); one whose host holds its key blocks when it does not answer."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

from pdctl.coord.lock import Holder
from pdctl.ops import restart
from pdctl.ops.context import Ops
from pdctl.ops.recover import Containment
from tests.unit.ops_fakes import (
    FakeEngines,
    FakeGateway,
    FakeKeys,
    FakeSystemd,
    Silent,
    fake_ops,
)

GONE = "http://gw2:8000"


def _ops(keys: FakeKeys, second: FakeGateway) -> tuple[Ops, FakeSystemd, FakeGateway, list[str]]:
    sd, first, said = FakeSystemd(), FakeGateway("http://gw1:8000"), []
    ops = fake_ops(sd, first, second)
    ops.store, ops.say = keys, said.append
    return ops, sd, first, said


def _gone_lines(said: list[str]) -> list[str]:
    return [line for line in said if f"gateway {GONE} is gone" in line]


def test_a_gateway_without_key_is_tried_once_briefly_then_left_out() -> None:
    for required in (True, False):  # an operator's restart, and a recovery
        keys, dead = FakeKeys({"node-a"}), Silent(GONE)
        ops, sd, first, said = _ops(keys, dead)
        rep = restart.restart_pair(ops, ops.source.pairs()[0], planned=required)
        assert rep.ok, rep.error
        # One connection attempt of GONE_CONNECT_S, then nothing: no drain, no register.
        assert dead.calls == [f"reachable {restart.GONE_CONNECT_S:g}s"]
        assert keys.reads == 1
        (line,) = _gone_lines(said)
        assert "router-2 is lost or its gateway stopped" in line
        assert [c for c in first.calls if c.startswith(("remove", "add"))] == [
            "remove http://10.0.0.1:30000",
            "remove http://10.0.0.1:30001",
            "add http://10.0.0.1:30000 pairing node-a/pd0",
            "add http://10.0.0.1:30001 pairing node-a/pd0",
        ]
        assert [job for job, _ in sd.jobs] == ["stop", "reset-failed", "start"]


def test_a_gateway_that_answers_without_its_key_is_drained_all_the_same() -> None:
    """Its lease unit may have failed while it serves: draining it is what spares clients."""
    keys, alone = FakeKeys({"node-a"}), FakeGateway(GONE)
    ops, _, _, said = _ops(keys, alone)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert rep.ok, rep.error
    assert alone.calls[0] == f"reachable {restart.GONE_CONNECT_S:g}s"
    assert sum(c.startswith("remove") for c in alone.calls) == 2
    assert sum(c.startswith("add") for c in alone.calls) == 2
    assert not _gone_lines(said)
    assert any(f"{GONE} answers, but its host holds no key" in line for line in said)
    assert any("pdstack-gateway-lease running on router-2" in line for line in said)


def test_a_gateway_that_holds_its_key_but_does_not_answer_blocks() -> None:
    keys, dead = FakeKeys({"node-a", "router-2"}), Silent(GONE)
    ops, sd, first, said = _ops(keys, dead)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert not rep.ok and rep.error is not None
    assert rep.error == f"drain: gateway {GONE}: ConnectTimeout: timed out; nothing was stopped"
    assert sd.jobs == [] and first.calls == [] and not _gone_lines(said)
    assert dead.calls == ["workers"]  # asked, not probed: its key says it is there


def test_while_etcd_cannot_tell_a_gateway_that_does_not_answer_blocks() -> None:
    keys, dead = FakeKeys((), down=True), Silent(GONE)
    ops, sd, _, said = _ops(keys, dead)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert not rep.ok and (rep.error or "").startswith(f"drain: gateway {GONE}: ConnectTimeout")
    assert sd.jobs == [] and not _gone_lines(said)


def test_a_gateway_whose_key_expires_during_the_restart_is_remembered_gone() -> None:
    """Its key was held at the first read; it took no connection at the drain, and by then
    its key had expired: the register does not try it again."""
    keys, dead = FakeKeys({"node-a", "router-2"}, then={"node-a"}), Silent(GONE)
    ops, _, first, said = _ops(keys, dead)
    rep = restart.restart_pair(ops, ops.source.pairs()[0])
    assert rep.ok, rep.error
    assert dead.calls == ["workers"]  # once, at the drain
    assert keys.reads == 2  # the first read, and once more after it took no connection
    assert len(_gone_lines(said)) == 1
    assert sum(c.startswith("add") for c in first.calls) == 2


def test_each_pairs_restart_reads_the_keys_afresh() -> None:
    """In a roll, a gateway that came back (its key held again) is drained like the others."""
    keys, back = FakeKeys({"node-a"}, then={"node-a", "router-2"}), FakeGateway(GONE)
    back.reachable = lambda connect_s: False  # type: ignore[method-assign]
    ops, _, _, said = _ops(keys, back)
    first, second = restart.restart_pairs(ops, ops.source.pairs())
    assert first.ok and second.ok, (first.error, second.error)
    assert len(_gone_lines(said)) == 1 and keys.reads == 2
    assert back.calls == [
        "remove http://10.0.0.1:30010",
        "remove http://10.0.0.1:30011",
        "add http://10.0.0.1:30010 pairing node-a/pd1",
        "add http://10.0.0.1:30011 pairing node-a/pd1",
    ]


def test_a_recoverys_drain_does_not_wait_for_a_lost_gateways_connection_attempt() -> None:
    """The gateway that answers takes the pair out while the keyless one is still being
    tried (each in its own thread); the live side's requests are ended after both."""
    removed = threading.Event()

    class Watched(FakeGateway):
        def remove(self, urls: Iterable[str]) -> None:
            super().remove(urls)
            removed.set()

    class Trying(Silent):
        def reachable(self, connect_s: float) -> bool:
            self.calls.append(f"removed elsewhere meanwhile: {removed.wait(5)}")
            return False

    sd, first, dead, said = FakeSystemd(), Watched("http://gw1:8000"), Trying(GONE), []
    ops = fake_ops(sd, first, dead)
    ops.store, ops.say = FakeKeys({"node-a"}), said.append
    assert isinstance(ops.engines, FakeEngines)
    rep = restart.restart_pair(ops, ops.source.pairs()[0], planned=False)
    assert rep.ok, rep.error
    assert dead.calls == ["removed elsewhere meanwhile: True"]
    assert len(_gone_lines(said)) == 1
    assert ops.engines.aborted == ["http://10.0.0.1:30000", "http://10.0.0.1:30001"]


def test_a_waiting_recovery_contains_its_pair_without_contacting_a_gone_gateway() -> None:
    keys, dead = FakeKeys({"node-a"}), Silent(GONE)
    ops, sd, first, said = _ops(keys, dead)
    Containment(ops, ops.source.pairs()[0])("etcd has no quorum", None)
    assert dead.calls == [f"reachable {restart.GONE_CONNECT_S:g}s"]
    assert first.calls == ["remove http://10.0.0.1:30000", "remove http://10.0.0.1:30001"]
    assert sd.jobs[0][0] == "stop" and len(_gone_lines(said)) == 1


def _holder(command: str, targets: tuple[str, ...]) -> Holder:
    return Holder(4242, command, 0.0, "ctl", targets=targets)


@pytest.mark.parametrize(
    ("holder", "contained"),
    [
        # Its own restart lists it: that restart brings it back.
        (_holder("pdctl restart --both node-a/pd0", ("node-a/pd0",)), False),
        # The command names it, the targets do not (a roll cut at WHAT_MAX lists it; a
        # prefix of its id in the command is another pair): only targets count.
        (_holder("pdctl restart --both node-a/pd0", ("node-a/pd00",)), True),
        (_holder("pdctl restart --both node-a/pd1", ("node-a/pd1",)), True),
        # An older pdctl's record: its targets are unknown, so the pair is contained.
        (_holder("pdctl restart --both --pair node-a/pd0", ()), True),
    ],
)
def test_containment_reads_the_holders_targets_never_its_command(
    holder: Holder, contained: bool
) -> None:
    ops, sd, first, _ = _ops(FakeKeys({"node-a"}), FakeGateway("http://gw2:8000"))
    Containment(ops, ops.source.pairs()[0])(f"held by {holder.describe()}", holder)
    assert bool(sd.jobs) is contained
    assert bool(first.calls) is contained
