"""Before/after per concurrency level: two sweeps (or bench_serving files) side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# (field, label, higher is better)
COMPARED = (
    ("output_throughput", "out tok/s", True),
    ("median_ttft_ms", "median TTFT ms", False),
    ("mean_tpot_ms", "mean TPOT ms", False),
    ("p99_itl_ms", "p99 ITL ms", False),
    ("median_e2e_latency_ms", "median e2e ms", False),
)


@dataclass(frozen=True)
class Delta:
    field: str
    before: float | None
    after: float | None
    higher_is_better: bool

    @property
    def pct(self) -> float | None:
        if self.before is None or self.after is None or self.before == 0:
            return None
        return 100.0 * (self.after - self.before) / self.before

    @property
    def better(self) -> bool | None:
        if (p := self.pct) is None or p == 0:
            return None
        return (p > 0) == self.higher_is_better


@dataclass(frozen=True)
class LevelComparison:
    concurrency: int
    deltas: list[Delta]


def by_concurrency(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last line per level wins (bench_serving appends reruns to the same file)."""
    return {int(r["max_concurrency"]): r for r in rows if r.get("max_concurrency")}


def compare(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
) -> list[LevelComparison]:
    a, b = by_concurrency(before), by_concurrency(after)
    out = []
    for c in sorted(a.keys() | b.keys()):
        ra, rb = a.get(c, {}), b.get(c, {})
        out.append(
            LevelComparison(
                c, [Delta(f, ra.get(f), rb.get(f), better) for f, _, better in COMPARED]
            )
        )
    return out


def as_dict(levels: Sequence[LevelComparison]) -> list[dict[str, Any]]:
    return [
        {
            "max_concurrency": lv.concurrency,
            **{
                d.field: {"before": d.before, "after": d.after, "delta_pct": d.pct}
                for d in lv.deltas
            },
        }
        for lv in levels
    ]
