"""The tests' PromQL reading: which metric names an expression selects (pdctl/promql.py, which
`pdctl validate --target-version` shares), whether counters only appear under rate/increase,
and Grafana variables replaced by values Prometheus accepts."""

from __future__ import annotations

import re

from pdctl.promql import STRING, metric_names, name_regexes

__all__ = ["counters_outside_rate", "metric_names", "name_regexes", "substitute"]

COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_UNDER_RATE = re.compile(r"(?:rate|irate|increase)\(\s*$")


# Grafana substitutes its variables before a query reaches Prometheus; "All" is `.*` here.
def substitute(expr: str, rate_interval: str = "1m") -> str:
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


# monitoring.queries.counted_from_zero's raw uses of the counter are its own: they
# read as increase().
_FROM_ZERO = re.compile(
    r"\(\(increase\((?P<c>[^\[\]()]+)\[(?P<w>[^\]]+)\]\) and (?P=c) offset (?P=w)\) or (?P=c)\)"
)


def counters_outside_rate(expr: str) -> list[str]:
    """Counter-like series used raw (not directly inside rate/irate/increase)."""
    skeleton = _FROM_ZERO.sub(r"increase(\g<c>[\g<w>])", STRING.sub('""', expr))
    bad = []
    for m in re.finditer(r"(?<![\w:])([a-zA-Z_:][\w:]*)", skeleton):
        name = m.group(1)
        if not name.endswith(COUNTER_SUFFIXES) or skeleton[m.end() :].lstrip().startswith("("):
            continue
        if not _UNDER_RATE.search(skeleton[: m.start()]):
            bad.append(name)
    return bad
