"""What a lint rule reports, and the registry the rule modules add themselves to."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from pdctl.spec import Deployment


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    where: str  # instance ids, a host, or "profile"
    message: str  # what is wrong and, where the seed hit it, what happened
    fix: str  # what to change, by profile key path


@dataclass(frozen=True)
class Problem:
    """A rule's raw report; the registry adds the rule's id and severity."""

    where: str
    message: str
    fix: str


Check = Callable[[Deployment], Iterable[Problem]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str  # one line for `pdctl validate --help`-style listings and docs/spec.md
    check: Check


RULES: list[Rule] = []


def rule(id: str, severity: Severity, summary: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        if any(r.id == id for r in RULES):
            raise ValueError(f"lint rule {id!r} registered twice")
        RULES.append(Rule(id, severity, summary, check))
        return check

    return register


def merged(id: str, severity: Severity, problems: Iterable[Problem]) -> list[Finding]:
    """One finding per message and fix: a problem repeated on several instances or hosts is
    one finding listing them all."""
    where: dict[tuple[str, str], list[str]] = {}
    for p in problems:
        places = where.setdefault((p.message, p.fix), [])
        if p.where not in places:
            places.append(p.where)
    return [
        Finding(id=id, severity=severity, where=", ".join(places), message=msg, fix=fix)
        for (msg, fix), places in where.items()
    ]
