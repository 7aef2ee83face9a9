"""The store's member set against the inventory's [etcd] group, before site.yml changes a host.

site.yml starts a member that has no data with the whole [etcd] group as its initial cluster.
That is right only for a store that is being formed. A running store takes a new member only
after `etcdctl member add` (the new one then starts with `--initial-cluster-state existing`),
and a member that lost its data only after it is removed and added again: started otherwise,
new members form a second cluster of their own (two of three new hosts are a quorum) or fail
to join. A member the store has but [etcd] no longer names still counts for its quorum. The
running store's own member list says which case a host is in; `check` turns it into one line
per host that says what to do (roles/pdstack_etcd preflight, through `pdctl etcd members`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdctl import names
from pdctl.coord.store import Store, StoreUnavailable
from pdctl.topology import TopologyCoord

DOCS = "docs/etcd.md, 'Change the members'"
JOIN = "-e pdstack_etcd_initial_cluster_state=existing"


@dataclass(frozen=True)
class Running:
    """A member in the running store's member list."""

    id: int
    name: str  # empty: added with `member add` and not started since
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]  # empty: it never ran (it publishes them when it starts)

    @property
    def started(self) -> bool:
        return bool(self.client_urls)


@dataclass(frozen=True)
class Wanted:
    """An [etcd] host, and whether it has member data (None: not in this run)."""

    name: str
    peer_url: str
    has_data: bool | None


def parse(members: Sequence[dict[str, object]]) -> list[Running]:
    """The gateway's /v3/cluster/member/list `members` (IDs come as decimal strings)."""
    return [
        Running(
            id=int(str(m.get("ID", 0))),
            name=str(m.get("name", "")),
            peer_urls=tuple(str(u) for u in m.get("peerURLs", []) or []),  # type: ignore[attr-defined]
            client_urls=tuple(str(u) for u in m.get("clientURLs", []) or []),  # type: ignore[attr-defined]
        )
        for m in members
    ]


def running(coord: TopologyCoord) -> list[Running] | None:
    """The store's member list, from the first member that answers; None when none does (or
    none accepts this client: then nothing can be told either)."""
    try:
        return parse(Store(coord).member_list())
    except (StoreUnavailable, OSError):  # OSError: TLS files that cannot be read
        return None


def _add(w: Wanted) -> str:
    return (
        f"etcdctl member add {w.name} --peer-urls={w.peer_url} on a live member, then "
        f"ansible-playbook site.yml --limit {w.name} {JOIN} ({DOCS})"
    )


def check(wanted: Sequence[Wanted], running: list[Running] | None, state: str) -> list[str]:
    """What stops site.yml from starting the [etcd] hosts as they are, one line per host;
    none when it may go on. `running`: the store's member list, None when no member
    answered. `state`: the initial cluster state site.yml starts a member without data with."""
    if all(w.has_data is False for w in wanted):
        return []  # a new store: this run forms it from [etcd]
    empty = [w for w in wanted if w.has_data is False]
    if running is None:
        if not empty:
            return []  # members with data restart as they are; nothing joins
        return [
            f"{', '.join(w.name for w in empty)}: no etcd data yet and no member of the store "
            f"answers, so pdstack cannot tell whether they may join: start {names.ETCD_UNIT} "
            "on the members that have data and run again (a store never formed: run site.yml "
            f"on every [etcd] host together) ({DOCS})"
        ]
    out = []
    by_peer = {u: m for m in running for u in m.peer_urls}
    for w in wanted:
        m = by_peer.get(w.peer_url)
        if w.has_data and m is None:
            out.append(
                f"{w.name}: its etcd data ({names.ETCD_DATA_DIR}) is of a member the store "
                f"no longer has (removed): on {w.name} systemctl stop {names.ETCD_UNIT} and "
                f"mv {names.ETCD_DATA_DIR} {names.ETCD_DATA_DIR}.old, then {_add(w)}"
            )
        elif w.has_data is not False:
            continue
        elif m is None:
            out.append(f"{w.name}: in [etcd] but not a member of the running store: {_add(w)}")
        elif m.started:
            out.append(
                f"{w.name}: member {m.id:x} of the store has no data on {w.name} (it lost it): "
                f"etcdctl member remove {m.id:x}, then {_add(w)}"
            )
        elif not m.name and state != "existing":
            out.append(
                f"{w.name}: added to the store (member {m.id:x}), so it must join it: "
                f"ansible-playbook site.yml --limit {w.name} {JOIN} ({DOCS})"
            )
    peers = {w.peer_url for w in wanted}
    for m in running:
        if not peers & set(m.peer_urls):
            who = m.name or "(never started)"
            out.append(
                f"{who}: member {m.id:x} of the store ({', '.join(m.peer_urls)}) is not in "
                f"[etcd] but still counts for its quorum: etcdctl member remove {m.id:x} on a "
                f"live member first, or keep the host in [etcd] ({DOCS})"
            )
    return out
