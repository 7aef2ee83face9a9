"""The deployment checked against another SGLang version before anything moves to it:
`pdctl validate --target-version X`, and `check_target` for a rollout's preflight.

Two lists per version ship in pdctl/data, each generated from the release itself:
sglang-<version>-flags.txt (scripts/sglang-flags.py, SGLang's own `ServerArgs.add_cli_args`)
and sglang-<version>-metrics.txt (scripts/sglang-metrics.py, every `sglang:*` family its
source creates). Every rendered launch flag (extra_args included) must name exactly one option
of the target's parser; every `sglang:*` series a rule or a dashboard of the monitoring pack
reads must be one the target emits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pdctl.errors import PdctlError
from pdctl.lint.finding import Finding, Problem, Severity, merged
from pdctl.lint.flags import (
    GENERATOR,
    ambiguous_problem,
    did_you_mean,
    known_flags,
    matches,
    refused_flags,
    unknown_problem,
)
from pdctl.promql import metric_names, name_regexes
from pdctl.spec import Deployment
from pdctl.spec.load import read_yaml

METRICS_GENERATOR = "scripts/sglang-metrics.py"
# The series Prometheus stores for one family of each type (a counter's name carries _total).
SERIES_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


# How alike a family the target emits must be to be offered as the missing one's new name
# (difflib's ratio; its default 0.6 offers unrelated families that share the sglang: prefix).
RENAME_CUTOFF = 0.8


class NoTargetList(PdctlError):
    """The target version has no flag or metric list in this pdctl: nothing can be checked."""


class PackUnreadable(PdctlError):
    """A file of the monitoring pack is no rules file or dashboard: nothing is checked."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path}: {why}: the monitoring pack is not checked (--monitoring DIR: a pack as "
            "python -m monitoring.build --out DIR writes it)"
        )


@cache
def known_families(version: str) -> dict[str, str] | None:
    """Family -> type of every `sglang:*` family sglang `version` creates; None when not shipped."""
    data = resources.files("pdctl") / "data" / f"sglang-{version}-metrics.txt"
    if not data.is_file():
        return None
    rows = (line.split() for line in data.read_text().splitlines() if not line.startswith("#"))
    return {name: kind for name, kind in rows}


def known_series(version: str) -> frozenset[str]:
    """The series names sglang `version` exposes (histograms as _bucket/_sum/_count)."""
    families = known_families(version) or {}
    return frozenset(f + s for f, kind in families.items() for s in SERIES_SUFFIXES[kind])


def shipped_versions() -> list[str]:
    """The versions pdctl has both lists for."""
    names = {p.name for p in (resources.files("pdctl") / "data").iterdir()}
    flags = {n[len("sglang-") : -len("-flags.txt")] for n in names if n.endswith("-flags.txt")}
    return sorted(v for v in flags if f"sglang-{v}-metrics.txt" in names)


def _require_lists(target: str) -> frozenset[str]:
    """The target's flags; NoTargetList when either of its lists is missing."""
    flags = known_flags(target)
    if flags is None or known_families(target) is None:
        raise NoTargetList(
            f"pdctl has no flag and metric lists for sglang {target} (it has "
            f"{', '.join(shipped_versions())}): generate them with {GENERATOR} and "
            f"{METRICS_GENERATOR} from that release's wheel (docs/spec.md, 'The flag lists')"
        )
    return flags


def _flag_problems(dep: Deployment, target: str, known: frozenset[str]) -> Iterator[Problem]:
    current = dep.profile.versions.sglang
    current_known = known_flags(current) or frozenset()
    for r in refused_flags(dep, known):
        if r.taken:
            yield ambiguous_problem(dep, r, target)
            continue
        # Taken by the current version: removed or renamed on the way to the target.
        was = len(matches(r.flag, current_known)) == 1
        note = f" (sglang {current} takes it: removed or renamed)" if was else ""
        yield unknown_problem(dep, r, target, known, note)


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the monitoring pack and who reads it."""

    kind: str  # "rule" or "dashboard"
    where: str  # "<rules file>: <alert or record>" or "<dashboard uid>: <panel title>"
    expr: str


def _rule_queries(path: Path) -> list[Query]:
    """The rules file's expressions. Malformed YAML is read_yaml's one-line SpecError; a file
    shaped otherwise than groups of rules that each have an expr, PackUnreadable."""
    data = read_yaml(path)
    try:
        return [
            Query("rule", f"{path.name}: {r.get('alert') or r.get('record')}", r["expr"])
            for group in (data or {}).get("groups", [])
            for r in group.get("rules", [])
        ]
    except (AttributeError, KeyError, TypeError):
        raise PackUnreadable(
            path, "not a Prometheus rules file (groups of rules with expr)"
        ) from None


def _dashboard_queries(path: Path) -> list[Query]:
    """The dashboard's expressions; PackUnreadable for a file that is no JSON or no dashboard."""
    try:
        board = json.loads(path.read_bytes())
    except OSError as e:
        raise PackUnreadable(path, f"cannot read: {e.strerror}") from None
    except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError of non-UTF-8 bytes
        raise PackUnreadable(path, f"not JSON ({e})") from None
    try:
        return list(_panel_queries(board.get("uid", path.stem), board))
    except (AttributeError, KeyError, TypeError):
        raise PackUnreadable(path, "not a Grafana dashboard (panels with targets)") from None


def _panel_queries(uid: str, node: Any) -> Iterator[Query]:
    """Every panel's targets, rows' nested panels included."""
    if isinstance(node, dict):
        for target in node.get("targets", []):
            if "expr" in target:
                yield Query("dashboard", f"{uid}: {node.get('title', '')}", target["expr"])
        for child in node.get("panels", []):
            yield from _panel_queries(uid, child)


def pack_queries(pack: Path) -> list[Query]:
    """The expressions of a monitoring pack as `python -m monitoring.build --out DIR` writes it
    (DIR/rules/*.yml, DIR/dashboards/*.json) or as committed (monitoring/dashboards/json/).
    A file that cannot be read as what its place says: one line naming it (PackUnreadable, or
    read_yaml's SpecError), never a traceback."""
    rules = [q for path in sorted(pack.glob("rules/*.yml")) for q in _rule_queries(path)]
    boards = sorted(pack.glob("dashboards/**/*.json"))
    return rules + [q for path in boards for q in _dashboard_queries(path)]


def _unemitted(expr: str, emitted: frozenset[str]) -> list[str]:
    """What an expression reads of `sglang:*` that `emitted` lacks: each series it names, and
    each `__name__` regex that selects none (a regex that still selects some reads what is
    there, as engine:sglang_pending_reqs:sum sums whichever queue gauges exist)."""
    names = sorted(n for n in metric_names(expr) if n.startswith("sglang:") and n not in emitted)
    regexes = [
        f'{{__name__=~"{rx}"}}'
        for rx in name_regexes(expr)
        if rx.startswith("sglang:") and not any(re.fullmatch(rx, s) for s in emitted)
    ]
    return names + regexes


CONSEQUENCE = {
    "rule": "an alert that reads it never fires, a recording rule records nothing",
    "dashboard": "the panels go blank",
}


def _metric_problems(dep: Deployment, target: str, pack: Path, kind: str) -> Iterator[Problem]:
    current = dep.profile.versions.sglang
    current_series = known_series(current)
    emitted = known_series(target)
    for q in pack_queries(pack):
        if q.kind != kind:
            continue
        for name in _unemitted(q.expr, emitted):
            was = f" (sglang {current} does)" if name in current_series else ""
            yield Problem(
                where=q.where,
                message=f"sglang {target} does not emit {name}{was}"
                f"{did_you_mean(name, emitted, RENAME_CUTOFF)}: {CONSEQUENCE[kind]}",
                fix=f"the pack's query of {name} (monitoring/): a family sglang {target} "
                "emits, then `python -m monitoring.build`",
            )


def check_target(dep: Deployment, target: str, pack: Path) -> list[Finding]:
    """What stops `dep` from running sglang `target`: errors for launch flags the target's
    parser refuses and for series the pack's rules read that it does not emit; warnings for
    dashboard panels that would go blank, and for a pack directory that is missing.
    NoTargetList, before anything is checked, when the target has no lists."""
    known = _require_lists(target)
    findings = merged("target-flag-refused", Severity.ERROR, _flag_problems(dep, target, known))
    if not pack.is_dir():
        problem = Problem(
            where="monitoring pack",
            message=f"no monitoring pack at {pack}: its rules and dashboards "
            f"are not checked against sglang {target}",
            fix="--monitoring DIR: the pack site.yml installs (monitoring/ in the checkout)",
        )
        return findings + merged("target-monitoring-unchecked", Severity.WARNING, [problem])
    findings += merged(
        "target-rule-metric-missing",
        Severity.ERROR,
        _metric_problems(dep, target, pack, "rule"),
    )
    findings += merged(
        "target-dashboard-metric-missing",
        Severity.WARNING,
        _metric_problems(dep, target, pack, "dashboard"),
    )
    return findings
