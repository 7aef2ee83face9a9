"""Just enough PromQL reading for the tests' checks on our own expressions: which metric names
an expression selects, whether counters only appear under rate/increase, and Grafana variables
replaced by values Prometheus accepts. Tests only: the builder writes PromQL, it never reads it
(its helpers are in monitoring/queries.py)."""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
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
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_UNDER_RATE = re.compile(r"(?:rate|irate|increase)\(\s*$")


# Grafana substitutes its variables before a query reaches Prometheus; "All" is `.*` here.
def substitute(expr: str, rate_interval: str = "1m") -> str:
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def _skeleton(expr: str) -> str:
    """The expression without strings, label matchers, ranges or grouping clauses."""
    out = _STRING.sub('""', expr)
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
    return _NAME_MATCHER.findall(expr)


# monitoring.queries.counted_from_zero's raw uses of the counter are its own: they
# read as increase().
_FROM_ZERO = re.compile(
    r"\(\(increase\((?P<c>[^\[\]()]+)\[(?P<w>[^\]]+)\]\) and (?P=c) offset (?P=w)\) or (?P=c)\)"
)


def counters_outside_rate(expr: str) -> list[str]:
    """Counter-like series used raw (not directly inside rate/irate/increase)."""
    skeleton = _FROM_ZERO.sub(r"increase(\g<c>[\g<w>])", _STRING.sub('""', expr))
    bad = []
    for m in re.finditer(r"(?<![\w:])([a-zA-Z_:][\w:]*)", skeleton):
        name = m.group(1)
        if not name.endswith(COUNTER_SUFFIXES) or skeleton[m.end() :].lstrip().startswith("("):
            continue
        if not _UNDER_RATE.search(skeleton[: m.start()]):
            bad.append(name)
    return bad
