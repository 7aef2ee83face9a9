"""`pdctl roll` (pdctl.ops.site_roll) over fakes: site.yml's plan in, the result out; each
group's outcome, the step it reached and its error; the lock held, a bad plan and a host or
engine the controller cannot reach all end in a result naming every group untouched; and the
play's failure message is the result's own."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl import converge, exits
from pdctl.errors import PdctlError
from pdctl.ops import lock, roll, site_roll
from pdctl.ops.context import Ops
from pdctl.ops.health import EngineProbe
from pdctl.ops.systemd import HostError, UnitStatus
from tests.unit.ops_fakes import FakeEngines, FakeGateway, FakeSystemd, fake_ops, topo

IDS = ["node-a/pd0", "node-a/pd1", "node-a/pd2"]


def _plan(**more: object) -> site_roll.Plan:
    return site_roll.Plan.model_validate({"groups": IDS, **more})


def _ops(sd: FakeSystemd, engines: FakeEngines | None = None) -> Ops:
    return fake_ops(sd, FakeGateway(), engines=engines, t=topo(pairs=("pd0", "pd1", "pd2")))


def test_every_group_restarted_says_so_with_its_steps(tmp_path: Path) -> None:
    sd = FakeSystemd()
    result = site_roll.run(_ops(sd), _plan(), None, tmp_path / "lock")
    assert (result.ok, result.exit, result.error, result.message) == (True, 0, None, None)
    assert [(g.id, g.outcome, g.phase, g.error) for g in result.groups] == [
        (i, "restarted", "register", None) for i in IDS
    ]
    assert list(result.groups[0].phases) == list(site_roll.restart.PHASES)
    # One group at a time, in the plan's order: each target stopped and started in turn.
    targets = [units[0] for verb, units in sd.jobs if verb in ("stop", "start")]
    assert targets == [f"pdstack-{p}.target" for p in ("pd0", "pd0", "pd1", "pd1", "pd2", "pd2")]


def test_a_failed_group_stops_the_roll_and_the_result_says_where(tmp_path: Path) -> None:
    """pd1's decode fails to start: pd0 restarted, pd1 failed at its health wait with its
    journal, pd2 untouched; the message names all three and what the operator finds."""
    sd = FakeSystemd(fail_start={"pdstack-pd1-decode.service"})

    def probe(url: str) -> EngineProbe:  # pd1's engines (ports 30010, 30011) never come up
        return EngineProbe(url, "unreachable (ConnectionError)" if ":3001" in url else "ok")

    result = site_roll.run(_ops(sd, FakeEngines(probe)), _plan(), None, tmp_path / "lock")
    assert (result.ok, result.exit, result.error) == (False, exits.FAILED, None)
    pd0, pd1, pd2 = result.groups
    assert (pd0.outcome, pd1.outcome, pd2.outcome) == ("restarted", "failed", "untouched")
    assert pd1.phase == "health" and pd1.error is not None
    assert pd1.error.phase == "health"
    assert "pdstack-pd1-decode.service is failed" in pd1.error.message
    assert pd1.journal["pdstack-pd1-decode.service"]  # the unit's last lines
    assert (pd2.phase, pd2.phases, pd2.error) == (None, {}, None)
    assert result.message == (
        "pdctl roll failed (exit 1): node-a/pd1: "
        f"{pd1.error.message}; restarted: node-a/pd0; untouched: node-a/pd2. A failed group "
        "stays out of the gateways and the groups after it were not restarted: pdctl status."
    )


def test_a_held_lock_leaves_every_group_untouched_and_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    sd = FakeSystemd()
    with lock.held("pdctl restart --both node-a/pd0", path):
        result = site_roll.run(_ops(sd), _plan(), None, path)
    assert (result.ok, result.exit) == (False, exits.LOCK_HELD)
    assert result.error is not None and "pdctl restart --both node-a/pd0" in result.error
    assert {g.outcome for g in result.groups} == {"untouched"}
    assert result.message is not None and result.message.endswith(
        f"; untouched: {', '.join(IDS)}. Nothing was stopped: pdctl status."
    )
    assert not sd.jobs


@pytest.mark.parametrize(
    ("plan", "error"),
    [
        ({"groups": ["node-a/pd9"]}, "unknown group 'node-a/pd9'"),
        ({"groups": IDS, "max_unavailable": "4"}, "more than the fleet's 3 groups"),
    ],
)
def test_a_plan_pdctl_refuses_changes_nothing(
    tmp_path: Path, plan: dict[str, object], error: str
) -> None:
    sd = FakeSystemd()
    result = site_roll.run(_ops(sd), site_roll.Plan.model_validate(plan), None, tmp_path / "l")
    assert result.exit == exits.BAD_INPUT and error in (result.error or ""), result
    assert {g.outcome for g in result.groups} == {"untouched"} and not sd.jobs


def test_max_unavailable_one_rolls_without_a_floor_and_more_with_one() -> None:
    assert site_roll.budget(_plan(), 3) == (roll.ONE, False)
    # Above 1: the floor of all groups but K, and a group an earlier failure left out of the
    # gateways restarts first (as `pdctl restart --max-unavailable K --include-drained`).
    assert site_roll.budget(_plan(max_unavailable="2"), 3) == (roll.Budget(2, 1), True)
    assert site_roll.budget(_plan(max_unavailable="50%"), 4) == (roll.Budget(2, 2), True)


class _NoSsh(FakeSystemd):
    def show(self, unit: str) -> UnitStatus:
        raise HostError("node-a: unreachable: `systemctl show`: Permission denied (publickey)")


@pytest.fixture
def listening() -> Iterator[tuple[int, int]]:
    """Two ports on loopback that take connections."""
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        yield a.getsockname()[1], b.getsockname()[1]


def _loopback_ops(sd: FakeSystemd, ports: dict[str, int]) -> Ops:
    """pd0's engines on loopback at `ports` (prefill, decode)."""
    t = topo(pairs=("pd0",))
    insts = [
        i.model_copy(update={"url": f"http://127.0.0.1:{ports[i.role.value]}"}) for i in t.instances
    ]
    return fake_ops(sd, FakeGateway(), t=t.model_copy(update={"instances": insts}))


def test_from_the_controller_every_host_and_engine_is_reached_before_anything_stops(
    tmp_path: Path, listening: tuple[int, int]
) -> None:
    plan = site_roll.Plan(groups=["node-a/pd0"], ssh_config="Host x\n")
    up = {"prefill": listening[0], "decode": listening[1]}
    reached = _loopback_ops(FakeSystemd(), up)
    site_roll.check_reach(reached, reached.source.pairs())  # raises nothing
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = free.getsockname()[1]
    sd = _NoSsh()
    result = site_roll.run(
        _loopback_ops(sd, {"prefill": listening[0], "decode": closed}), plan, None, tmp_path / "l"
    )
    assert result.exit == exits.BAD_INPUT and result.groups[0].outcome == "untouched"
    error = result.error or ""
    assert "the controller cannot reach node-a as root over ssh" in error
    assert f"the controller cannot reach http://127.0.0.1:{closed} " in error
    assert "pdstack_engine_firewall_allow: [CONTROLLER_ADDRESS]" in error
    assert f"127.0.0.1:{listening[0]}" not in error and error.endswith("nothing was stopped")
    assert not sd.jobs


def test_the_role_reads_the_result_or_says_why_there_is_none(tmp_path: Path) -> None:
    result = site_roll.refused(IDS, PdctlError("boom"))
    assert converge.roll_result(result.model_dump_json(), 2) == json.loads(result.model_dump_json())
    for stdout in ("", "Traceback (most recent call last):", "[]", '{"ok": true}'):
        got = converge.roll_result(stdout, 1)
        assert got["ok"] is False and got["groups"] == [], stdout
        assert got["message"].startswith("pdctl roll ended (exit 1) without its result")
