"""The coordination store: how many [etcd] members, and what the count tolerates."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.spec import Deployment

DOCS = "docs/etcd.md"


def _where(dep: Deployment) -> str:
    return f"{dep.inventory_path} [etcd]"


@rule("etcd-members", Severity.ERROR, "the inventory's [etcd] group is empty or even-sized above 2")
def etcd_members(dep: Deployment) -> Iterator[Problem]:
    count = len(dep.etcd)
    if count == 0:
        yield Problem(
            where=_where(dep),
            message="no [etcd] hosts: the restart lock, the gateways' liveness keys and the "
            "restart history live in the etcd store, so no restart or recovery could run",
            fix=f"add an [etcd] group to {dep.inventory_path}: one host (a [router] host), or "
            f"three for a store that survives losing one ({DOCS})",
        )
    elif count > 2 and count % 2 == 0:
        yield Problem(
            where=_where(dep),
            message=f"{count} members need {count // 2 + 1} for quorum and survive losing "
            f"{(count - 1) // 2}, as {count - 1} do: the extra member adds a failure and no "
            "tolerance",
            fix=f"[etcd]: {count - 1} or {count + 1} hosts ({DOCS})",
        )


@rule("etcd-two-members", Severity.WARNING, "two [etcd] members: losing either stops the store")
def etcd_two_members(dep: Deployment) -> Iterator[Problem]:
    if len(dep.etcd) == 2:
        yield Problem(
            where=", ".join(m.name for m in dep.etcd),
            message="two members need both for quorum: losing either one stops restarts and "
            "crash recovery, as with one member, and twice as likely",
            fix=f"[etcd]: add a third host (or keep one) ({DOCS})",
        )
