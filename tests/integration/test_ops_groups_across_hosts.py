"""A 1P2D group across three pretend hosts (loopback addresses 127.0.0.2-4, each host its own
units) beside a pair on a fourth, behind the real gateway (smg): registered under the group's
fleet-wide id, restarted as one unit on all its hosts under streaming load with no failed
request and no KV transfer outside a group, and recovered whole after a kill -9 of one decode
(docs/spec.md, "Groups across hosts")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pdctl import pdclient
from pdctl.ops.context import Ops
from pdctl.ops.recover import RateLimit, RecoveryLog, recover
from pdctl.ops.restart import restart_pairs
from pdctl.testing.localproc import (
    LocalGroup,
    LocalPair,
    LocalUnits,
    behind_gateway,
    transfers_read,
)
from pdctl.testing.stack import Gateway, SimProc, constant_load, partner_env, wait_until

pytestmark = pytest.mark.gateway

PREFILL_HOST, DECODE_HOSTS = "127.0.0.2", ("127.0.0.3", "127.0.0.4")


@pytest.fixture
def across(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Ops, dict[str, LocalUnits]]:
    monkeypatch.setenv("PDCTL_LOCK", str(tmp_path / "restart.lock"))
    prefill = sim_factory("prefill")
    pair = LocalPair("pd0", prefill, sim_factory("decode", env=partner_env(prefill)))
    g1_prefill = sim_factory("prefill", address=PREFILL_HOST)
    decodes = [
        sim_factory("decode", env=partner_env(g1_prefill), address=host) for host in DECODE_HOSTS
    ]
    group = LocalGroup("g1", [g1_prefill], decodes, across=True)
    return behind_gateway([pair, group], gateway_factory)


def test_the_group_restarts_on_all_its_hosts_under_load(
    across: tuple[Ops, dict[str, LocalUnits]],
) -> None:
    ops, units = across
    pd0, g1 = ops.source.pairs()
    assert (pd0.id, g1.id, g1.hosts) == ("local/pd0", "g1", [PREFILL_HOST, *DECODE_HOSTS])
    bound = {w.url: w.pairing for w in ops.gateways[0].workers()}
    assert {bound[i.url] for i in g1.instances} == {"g1"}

    with (
        transfers_read(list(units.values())) as snapshots,
        constant_load(ops.source.topology.gateways[0].url, timeout=30) as outcomes,
    ):
        wait_until(lambda: len(outcomes) >= 20, 30, "load to flow")
        (rep,) = restart_pairs(ops, [g1])
        before_end = len(outcomes)
        wait_until(lambda: len(outcomes) >= before_end + 30, 30, "load after the restart")
    assert rep.ok, (rep.error, rep.journal)
    # Each host's systemd stopped and started its own members, through its own target.
    for inst in g1.instances:
        jobs = set(units[inst.host].jobs)
        assert {("stop", inst.unit), ("start", inst.unit)} <= jobs, (inst.host, jobs)
    assert not {("stop", i.unit) for i in pd0.instances} & set(units["local"].jobs)
    crossed = [s for s in snapshots if any(s.values())]
    assert not crossed, f"KV transfers outside a group: {crossed}"
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} client requests failed: {failed[:10]}"
    print(f"{len(outcomes)} streamed requests, {rep.phases}", file=sys.stderr)
    # Both decodes served after the restart, each from the group's prefill on another host.
    assert pdclient.group_canary(g1.canary_legs()).ok
    assert {w.url: w.pairing for w in ops.gateways[0].workers()} == bound


def test_a_killed_decode_on_one_host_recovers_the_group_on_all(
    across: tuple[Ops, dict[str, LocalUnits]], tmp_path: Path
) -> None:
    ops, units = across
    killed_host = DECODE_HOSTS[1]
    # What the recovery unit on the crashed decode's host names (recover@.service.j2).
    (g1,) = ops.source.select((f"{killed_host}/g1",), False)
    units[killed_host].procs[g1.decodes[1].unit].kill()  # kill -9 of one decode
    rep = recover(ops, g1, RateLimit(), RecoveryLog(tmp_path / "recover.json"), lock_wait=60)
    assert rep.ok, (rep.error, rep.journal)
    for inst in g1.instances:  # the members on the other hosts restarted with it
        assert ("start", inst.unit) in units[inst.host].jobs, inst.id
    assert not units["local"].jobs  # the pair served on
    assert pdclient.group_canary(g1.canary_legs()).ok
