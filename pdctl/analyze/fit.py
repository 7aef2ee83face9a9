"""The decode step-time law: ms = a + b * batch, and the throughput ceiling it implies.

A decode step for `bs` running requests takes a + b*bs ms (a: the fixed per-step cost —
launches, all-reduce, weights read once; b: the per-request cost — KV reads, attention).
Each step yields one token per request (`accept len` tokens with speculative decoding, where
a step is one draft-and-verify round), so the aggregate rate is

    tok/s = 1000 * accept_len * bs / (a + b*bs)  ->  1000 * accept_len / b   as bs grows,

the asymptote the seed deployment hit at ~32 tok/s (b ~ 31 ms) before its fixes. The same
law with bs = client concurrency C and step = TPOT is what `pdctl bench sweep` fits.

Inside a CUDA graph a batch is padded up to the captured size, so the step costs what the
padded batch costs. When graph buckets are known the law is fitted at the bucket sizes only
(no padding there); otherwise at every batch size, as the seed team did by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdctl.analyze.decode_table import DecodeTable, PrefillSummary


@dataclass(frozen=True)
class LinearFit:
    a: float
    b: float
    r2: float
    points: int

    @property
    def asymptote_tps(self) -> float | None:
        """1000/b tok/s; None when the cost does not grow with the batch."""
        return 1000.0 / self.b if self.b > 0 else None

    def at(self, x: float) -> float:
        return self.a + self.b * x

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "a_ms": self.a,
            "b_ms": self.b,
            "r2": self.r2,
            "points": self.points,
            "asymptote_tok_s": self.asymptote_tps,
        }


def linear_fit(points: Sequence[tuple[float, float, float]]) -> LinearFit | None:
    """Weighted least squares over (x, y, weight); None without two distinct x."""
    w = sum(p[2] for p in points)
    if w <= 0 or len({p[0] for p in points}) < 2:
        return None
    mx = sum(x * wt for x, _, wt in points) / w
    my = sum(y * wt for _, y, wt in points) / w
    sxx = sum(wt * (x - mx) ** 2 for x, _, wt in points)
    sxy = sum(wt * (x - mx) * (y - my) for x, y, wt in points)
    b = sxy / sxx
    a = my - b * mx
    ss_tot = sum(wt * (y - my) ** 2 for _, y, wt in points)
    ss_res = sum(wt * (y - a - b * x) ** 2 for x, y, wt in points)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(a, b, r2 if math.isfinite(r2) else 0.0, len(points))


@dataclass(frozen=True)
class StepLaw:
    fit: LinearFit
    basis: str  # "bucket sizes" or "all batch sizes"
    accept_len: float | None = None  # the fit is per speculative step (draft + verify)

    @property
    def asymptote_tps(self) -> float | None:
        """Tokens/s as the batch grows: 1000/b steps/s per request, times the accept length."""
        top = self.fit.asymptote_tps
        return None if top is None else top * (self.accept_len or 1.0)

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            **self.fit.as_dict(),
            "asymptote_tok_s": self.asymptote_tps,
            "basis": self.basis,
            "per": "speculative step" if self.accept_len else "decode step",
            "accept_len": self.accept_len,
        }


def step_time_law(table: DecodeTable, buckets: Sequence[int] = ()) -> StepLaw | None:
    """Fit graph-mode step times; eager steps follow another law and are left out."""
    points = [
        (float(r.running), step, float(r.graph_lines))
        for r in table.sorted_rows()
        if (step := r.graph_step_ms) is not None
    ]
    on_buckets = [p for p in points if int(p[0]) in set(buckets)]
    if (fit := linear_fit(on_buckets)) is not None:
        return StepLaw(fit, "bucket sizes", table.accept_len)
    if (fit := linear_fit(points)) is not None:
        return StepLaw(fit, "all batch sizes", table.accept_len)
    return None


def prefill_law(prefill: PrefillSummary) -> LinearFit | None:
    """ms per prefill batch = a + b * new tokens, from the busy pairs (decode_table.py): a is
    the per-batch cost, b the per-token one; cached tokens cost (almost) nothing and are out."""
    return linear_fit(
        [(float(tokens), ms / n, n) for tokens, (n, ms) in sorted(prefill.busy.items())]
    )
