"""What every area of rules shares: the config an area builds from, the shape of an alert and
a recording rule, and Prometheus' templating for annotations.

Scrape jobs by selector: engines (sglang:*), gateway (smg_*), exporter (pdstack_*), node, etcd.
The scrape config gives every target a host label, and engine targets engine (HOST/PAIR-ROLE),
role and pair (HOST/PAIR; a group's id HOST/GROUP, its members HOST/GROUP-ROLEn) labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monitoring.config import Config, Selectors, Thresholds
from monitoring.queries import rank_rate_sum

Rule = dict[str, Any]
_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}

# Recording rules the alerts of several areas read (monitoring/alerts/records.py writes them).
PENDING = "engine:sglang_pending_reqs:sum"
MEMBERS = "pair_role:pdstack_group_members:max"
MEMBERS_UP = "pair_role:sglang_members_up:sum"


def label(name: str) -> str:
    """Prometheus' alert templating for a label of the alert."""
    return f"{{{{ $labels.{name} }}}}"


def value(fn: str = "") -> str:
    return f"{{{{ $value | {fn} }}}}" if fn else "{{ $value }}"


def spoken(window: str) -> str:
    """5m -> "5 minutes" (descriptions read as text)."""
    count, unit = int(window[:-1]), _UNITS[window[-1]]
    return f"{count} {unit}{'' if count == 1 else 's'}"


ENGINE_OF = f"{label('role')} engine {label('engine')} of pair {label('pair')}"


def record(name: str, expr: str) -> Rule:
    return {"record": name, "expr": expr}


@dataclass(frozen=True)
class Area:
    """The config one area's rules are built from, with the alert shape they share."""

    cfg: Config

    @property
    def sel(self) -> Selectors:
        return self.cfg.selectors

    @property
    def th(self) -> Thresholds:
        return self.cfg.thresholds

    @property
    def window(self) -> str:
        return self.cfg.rate_window

    @property
    def over(self) -> str:
        """The rule window as descriptions say it ("5 minutes")."""
        return spoken(self.window)

    def alert(
        self, name: str, expr: str, hold: Any, severity: str, summary: str, description: str
    ) -> Rule:
        return {
            "alert": name,
            "expr": expr,
            "for": hold,
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": self.cfg.runbook(name),
            },
        }

    def per_engine(self, metric: str, *matchers: str, fn: str = "rate") -> str:
        """Failure, retraction and decode-pass counters are written by every TP rank for the
        same event (docs/monitoring.md): one rank's series (max over tp_rank) is the truth."""
        selector = ", ".join((self.sel.engines, *matchers))
        return rank_rate_sum(metric, selector, "pair, role, engine", self.window, fn)
