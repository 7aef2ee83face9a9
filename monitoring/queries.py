"""PromQL the rules and the dashboards share. No Grafana import: the rules are built on the
controller by Ansible's filter plugin, where the dashboards' SDK is not installed."""

from __future__ import annotations

# Grafana's rate window for dashboards; the rules use the config's rate_window.
RATE_INTERVAL = "$__rate_interval"


def series(metric: str, *matchers: str) -> str:
    """`metric{a, b}` from label matchers, empty ones dropped."""
    return f"{metric}{{{', '.join(m for m in matchers if m)}}}"


def rate_sum(
    metric: str, selector: str, by: str, window: str = RATE_INTERVAL, fn: str = "rate"
) -> str:
    return f"sum by ({by}) ({fn}({series(metric, selector)}[{window}]))"


def rank_rate_sum(
    metric: str, selector: str, by: str, window: str = RATE_INTERVAL, fn: str = "rate"
) -> str:
    """For counters every TP rank increments for the same event (failures, retractions,
    decode passes): one rank's rate, not TP times it (docs/monitoring.md)."""
    return f"sum by ({by}) (max without (tp_rank) ({fn}({series(metric, selector)}[{window}])))"


def quantile(q: float, histogram: str, selector: str, by: str, window: str = RATE_INTERVAL) -> str:
    """histogram_quantile over buckets summed by `by` (plus `le`)."""
    return (
        f"histogram_quantile({q}, {rate_sum(histogram + '_bucket', selector, 'le, ' + by, window)})"
    )


def counted_from_zero(counter: str, window: str) -> str:
    """The increase of `counter` (a selector) over `window`, counting the whole value of a
    series born inside it: increase() needs two samples, so it misses the events that created
    a series, and an exporter writes a labelled counter (an XID code) at its first event."""
    return f"((increase({counter}[{window}]) and {counter} offset {window}) or {counter})"
