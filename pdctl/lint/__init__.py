"""The pitfall linter: every rule knows one way a PD deployment breaks, and how to fix it."""

from __future__ import annotations

# Importing a rule module registers its rules; the order here is the report order.
from pdctl.lint import layout, pairing, parallel, crossrole, cuda_graphs  # noqa: F401  # isort: skip
from pdctl.lint import memory, network, flags, family, store  # noqa: F401  # isort: skip
from pdctl.lint.finding import RULES, Finding, Rule, Severity, merged
from pdctl.spec import Deployment

__all__ = ["RULES", "Finding", "Rule", "Severity", "lint"]


def lint(dep: Deployment) -> list[Finding]:
    """All findings; one problem repeated on several instances or hosts is one finding."""
    return [f for r in RULES for f in merged(r.id, r.severity, r.check(dep))]
