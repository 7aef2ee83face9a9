"""Just enough PromQL reading to know which metric names an expression selects: the monitoring
pack's checks against an SGLang version (pdctl/lint/target.py) and the tests' (tests/promql.py)
read our own expressions with it. The builder writes PromQL, it never reads it (its helpers are
in monitoring/queries.py)."""

from __future__ import annotations

import re

STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])[a-zA-Z_:][\w:]*")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}
_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"([^"]*)"')


def _skeleton(expr: str) -> str:
    """The expression without strings, label matchers, ranges or grouping clauses."""
    out = STRING.sub('""', expr)
    out = _MATCHERS.sub("", out)
    out = _RANGE.sub("", out)
    return _GROUPING.sub("", out)


def metric_names(expr: str) -> set[str]:
    """Metric names selected by bare name (`__name__` regex selectors are not expanded)."""
    skeleton = _skeleton(expr)
    return {
        m.group()
        for m in _IDENT.finditer(skeleton)
        if m.group().lower() not in _KEYWORDS and not skeleton[m.end() :].lstrip().startswith("(")
    }


def name_regexes(expr: str) -> list[str]:
    """The `__name__` regexes (or exact names) of an expression's selectors."""
    return _NAME_MATCHER.findall(expr)
