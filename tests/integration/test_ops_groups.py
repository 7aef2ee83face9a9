"""A host-local 2P1D group beside a pair, behind the real gateway (smg): registered under the
group's id as pairing protocol, so any prefill of the group pairs with its decode and nothing
crosses between the group and the pair; restarted as one unit, its canary through every
prefill and every decode (docs/restart.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl import pdclient
from pdctl.cli.status_view import to_json
from pdctl.ops import doctor
from pdctl.ops.context import Ops
from pdctl.ops.health import HttpCanaries, Leg
from pdctl.ops.recover import RateLimit, RecoveryLog, recover
from pdctl.ops.restart import plan_lines, register_gateways, restart_pairs
from pdctl.ops.status import collect
from pdctl.pdclient import CanaryResult
from pdctl.testing.localproc import (
    HOST,
    LocalGroup,
    LocalPair,
    LocalUnits,
    behind_gateway,
    transfers_read,
)
from pdctl.testing.stack import (
    Gateway,
    SimProc,
    constant_load,
    partner_env,
    wait_until,
)

pytestmark = pytest.mark.gateway


@pytest.fixture
def group_and_pair(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Ops, LocalUnits]:
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    prefill = sim_factory("prefill")
    pair = LocalPair("pd0", prefill, sim_factory("decode", env=partner_env(prefill)))
    prefills = [sim_factory("prefill"), sim_factory("prefill")]
    group = LocalGroup("g0", prefills, [sim_factory("decode", env=partner_env(*prefills))])
    ops, units = behind_gateway([pair, group], gateway_factory)
    return ops, units[HOST]


def test_group_is_registered_restarted_and_canaried_as_one_unit(
    group_and_pair: tuple[Ops, LocalUnits], monkeypatch: pytest.MonkeyPatch
) -> None:
    ops, units = group_and_pair
    pd0, g0 = ops.source.pairs()
    assert (pd0.id, g0.id) == ("local/pd0", "local/g0")
    assert [i.name for i in g0.instances] == ["g0-prefill0", "g0-prefill1", "g0-decode0"]
    bound = {w.url: w.pairing for w in ops.gateways[0].workers()}
    assert bound == {i.url: u.id for u in (pd0, g0) for i in u.instances}
    # What the gateway unit runs at each start (pdctl gateway register) finds them bound.
    (again,) = register_gateways(ops, (), 10)
    assert set(again.workers.values()) == {"bound"} and len(again.workers) == 5
    assert "group local/g0" in "\n".join(plan_lines(ops, [g0]))

    legs: list[tuple[str, str]] = []

    class Recorded(HttpCanaries):
        """The real canaries, each leg they send down recorded."""

        def pair(self, prefill: str, decode: str, *args: Any) -> CanaryResult:
            legs.append((prefill, decode))
            return super().pair(prefill, decode, *args)

        def group(self, group_legs: list[Leg], count: int) -> CanaryResult:
            legs.extend((p, d) for p, d, _ in group_legs)
            return super().group(group_legs, count)

    monkeypatch.setattr(ops, "canaries", Recorded())
    with (
        transfers_read([units]) as snapshots,
        constant_load(ops.source.topology.gateways[0].url, timeout=30) as outcomes,
    ):
        wait_until(lambda: len(outcomes) >= 20, 30, "load to flow")
        (rep,) = restart_pairs(ops, [g0])
        before_end = len(outcomes)
        wait_until(lambda: len(outcomes) >= before_end + 30, 30, "load after the restart")
    assert rep.ok, (rep.error, rep.journal)
    # The target took every member down and up (LocalUnits records the units it expands to).
    assert {(v, i.unit) for i in g0.instances for v in ("stop", "start")} <= set(units.jobs)
    assert not {("stop", i.unit) for i in pd0.instances} & set(units.jobs)  # the pair served on
    # The canary (first and verify) went through every prefill and every decode of the group.
    assert {p for p, _ in legs} == {i.url for i in g0.prefills}
    assert {d for _, d in legs} == {i.url for i in g0.decodes}
    crossed = [s for s in snapshots if any(s.values())]
    assert not crossed, f"KV transfers between the group and the pair: {crossed}"
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    assert {w.url: w.pairing for w in ops.gateways[0].workers()} == bound


def test_status_canaries_every_member_of_the_group(
    group_and_pair: tuple[Ops, LocalUnits],
) -> None:
    ops, units = group_and_pair
    assert collect(ops).healthy
    g0 = ops.source.pairs()[1]
    units.stop(g0.prefills[1].unit)  # the second prefill: a canary through the first passes
    s = collect(ops)
    (bad,) = [p for p in s.pairs if not p.canary.ok]
    assert bad.id == g0.id
    assert bad.canary.error is not None and g0.prefills[1].url in bad.canary.error


def test_doctor_names_a_member_registered_under_the_pairs_protocol(
    group_and_pair: tuple[Ops, LocalUnits],
) -> None:
    """The group's decode taken out of the real gateway and added back under the pair's id
    (as by hand, or a script that registers by URL): doctor names it, its group, the protocol
    it has and the fix; status lists the group's members."""
    ops, _ = group_and_pair
    pd0, g0 = ops.source.pairs()
    gw, decode = ops.gateways[0], g0.decodes[0]
    assert doctor.binding_findings(collect(ops)) == []
    gw.remove([decode.url])
    assert gw.wait(lambda ws: decode.url not in {w.url for w in ws}, 30), "smg removed it"
    gw.add(decode.url, "decode", pairing=pd0.id)
    assert gw.wait(lambda ws: any(w.url == decode.url and w.pairing == pd0.id for w in ws), 30)
    s = collect(ops)
    (found,) = doctor.binding_findings(s)
    assert (found.id, found.where) == ("live-misbound", decode.id)
    assert f"decode of {g0.id} is registered at {gw.url} under {pd0.id}'s" in found.message
    assert found.fix == f"pdctl restart --both --pair {g0.id}"
    (group,) = [p for p in to_json(s)["pairs"] if "members" in p]
    assert group["members"] == {
        "prefill": tuple(i.id for i in g0.prefills),
        "decode": (decode.id,),
    }


def test_a_killed_member_recovers_the_whole_group(
    group_and_pair: tuple[Ops, LocalUnits], tmp_path: Path
) -> None:
    ops, units = group_and_pair
    pd0, g0 = ops.source.pairs()
    units.procs[g0.decodes[0].unit].kill()  # kill -9 of the group's decode
    rep = recover(ops, g0, RateLimit(), RecoveryLog(tmp_path / "recover.json"), lock_wait=60)
    assert rep.ok, (rep.error, rep.journal)
    assert {("start", i.unit) for i in g0.instances} <= set(units.jobs)
    assert not {("stop", i.unit) for i in pd0.instances} & set(units.jobs)
    assert pdclient.group_canary(g0.canary_legs()).ok
