"""The store's member set against [etcd] (pdctl.coord.members): which changes site.yml may
make by itself, and the one line per host for those it must not (a running store takes new
members only after `etcdctl member add`). The same checks against a real etcd are in
tests/integration/test_etcd_store.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.coord.members import Running, Wanted, check, parse
from tests.conftest import run_pdctl

P = {n: f"https://10.0.0.{i}:2380" for i, n in enumerate(["e1", "e2", "e3", "e4"], 1)}


def _ran(name: str, ident: int) -> Running:
    return Running(ident, name, (P[name],), (P[name].replace("2380", "2379"),))


RUNNING = [_ran("e1", 0xA1), _ran("e2", 0xA2), _ran("e3", 0xA3)]


def _want(**data: bool | None) -> list[Wanted]:
    return [Wanted(n, P[n], d) for n, d in data.items()]


def test_a_new_store_and_a_store_as_it_is_go_on() -> None:
    assert check(_want(e1=False, e2=False, e3=False), None, "new") == []
    assert check(_want(e1=True, e2=True, e3=True), RUNNING, "new") == []
    assert check(_want(e1=True, e2=True, e3=True), None, "new") == []  # restarts as they are
    assert check(_want(e1=True, e2=None, e3=None), RUNNING, "new") == []  # --limit e1


def test_a_host_added_to_etcd_is_refused_until_member_add() -> None:
    (line,) = check(_want(e1=True, e2=True, e3=True, e4=False), RUNNING, "new")
    assert line.startswith("e4: in [etcd] but not a member of the running store: ")
    assert f"etcdctl member add e4 --peer-urls={P['e4']} on a live member" in line
    assert "site.yml --limit e4 -e pdstack_etcd_initial_cluster_state=existing" in line


def test_an_added_member_joins_only_as_existing() -> None:
    added = [*RUNNING, Running(0xA4, "", (P["e4"],), ())]
    want = _want(e1=True, e2=None, e3=None, e4=False)
    (line,) = check(want, added, "new")
    assert line.startswith("e4: added to the store (member a4), so it must join it: ")
    assert check(want, added, "existing") == []


def test_a_member_that_never_started_forms_the_store_with_the_others() -> None:
    """A first run that stopped half way: e2 and e3 are members from the initial cluster."""
    formed = [RUNNING[0], Running(0xA2, "e2", (P["e2"],), ()), Running(0xA3, "e3", (P["e3"],), ())]
    assert check(_want(e1=True, e2=False, e3=False), formed, "new") == []


def test_a_member_that_lost_its_data_is_removed_and_added_again() -> None:
    (line,) = check(_want(e1=True, e2=False, e3=True), RUNNING, "new")
    assert line.startswith("e2: member a2 of the store has no data on e2 (it lost it): ")
    assert "etcdctl member remove a2, then etcdctl member add e2" in line


def test_a_host_removed_from_etcd_is_refused_while_still_a_member() -> None:
    (line,) = check(_want(e1=True, e2=True), RUNNING, "new")
    assert line.startswith(f"e3: member a3 of the store ({P['e3']}) is not in [etcd] ")
    assert "etcdctl member remove a3 on a live member first" in line


def test_data_of_a_removed_member_is_refused() -> None:
    (line,) = check(_want(e1=True, e2=True, e3=True), RUNNING[:2], "new")
    assert line.startswith("e3: its etcd data (/var/lib/pdstack-etcd) is of a member the store ")


def test_new_hosts_beside_data_when_nothing_answers_are_refused() -> None:
    """Two new hosts of three would form a store of their own beside e1's."""
    (line,) = check(_want(e1=True, e2=False, e3=False), None, "new")
    assert line.startswith("e2, e3: no etcd data yet and no member of the store answers")
    assert "start pdstack-etcd.service on the members that have data and run again" in line


def test_the_gateways_member_list_parses() -> None:
    listed = [
        {"ID": "161", "name": "e1", "peerURLs": [P["e1"]], "clientURLs": ["https://x:2379"]},
        {"ID": "164", "peerURLs": [P["e4"]]},  # added, not started: no name, no client URLs
    ]
    assert parse(listed) == [
        Running(161, "e1", (P["e1"],), ("https://x:2379",)),
        Running(164, "", (P["e4"],), ()),
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--member", "e1"], "--member 'e1': write NAME=ADDRESS"),
        (["--member", "e1=10.0.0.1", "--no-data", "e9"], "--data/--no-data e9: not a --member"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path: Path, args: list[str], error: str) -> None:
    base = ["etcd", "members", "--dir", str(tmp_path), "--client-port", "2379"]
    run = run_pdctl(*base, "--peer-port", "2380", *args)
    assert run.exit_code == 2 and run.stderr.startswith(f"Error: {error}"), run.stderr


def test_a_new_store_is_not_asked(tmp_path: Path) -> None:
    """No member has data: nothing to ask (the PKI does not even exist yet)."""
    base = ["etcd", "members", "--dir", str(tmp_path / "none"), "--client-port", "2379"]
    run = run_pdctl(*base, "--peer-port", "2380", "--member", "e1=10.0.0.1", "--no-data", "e1")
    assert (run.exit_code, run.stdout, run.stderr) == (0, "", "")
