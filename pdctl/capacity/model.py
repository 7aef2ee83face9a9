"""What one prefill and one decode engine do under a share of the workload.

Decode. A step for `n` running requests runs in the graph of the smallest bucket >= n and
takes `a + b x bucket` ms (the law from the decode journal); that step time is every running
request's inter-token latency. So an ITL target T caps the running requests at the largest
bucket whose step fits in T (`decode_cap`): coarse buckets cap lower than fine ones, because
the batch just above a bucket pays for the next one's padding. That cap becomes the decode's
`max_running_requests`.

With requests arriving at random (Poisson) and each staying for its output length, the
running count of a decode is close to Poisson with mean R (an infinite-server queue), and R
follows Little's law: R = rate x output steps x mean step time, solved as a fixed point
because the step time grows with R. A generated token sees the batch it was generated in, and
a batch of n yields n tokens, so tokens see the size-biased count 1 + Poisson(R): the ITL
percentiles are the step times at its percentiles. The decode is feasible when its running
count stays within the cap but for SLOT_OVERFLOW of the time (above the cap requests wait).

Prefill: prefill.py (a batching queue, then the PD handoff); a first token also waits for the
decode step under way when its KV lands (StepInProgress).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from pdctl.analyze.buckets import padded

SLOT_OVERFLOW = 0.01  # share of the time a decode may hold more requests than its cap
_FIXED_POINT_ROUNDS = 200


@dataclass(frozen=True)
class DecodeLaw:
    a_ms: float
    b_ms: float
    accept_len: float = 1.0  # tokens per request per step (speculative decoding)

    def step_ms(self, batch: int) -> float:
        return self.a_ms + self.b_ms * batch


@dataclass(frozen=True)
class PrefillLaw:
    a_ms: float
    b_ms: float  # per new token

    def batch_ms(self, tokens: float) -> float:
        return self.a_ms + self.b_ms * tokens


def step_at(law: DecodeLaw, sizes: list[int], running: int) -> float:
    """A step of `running` requests in its graph (sorted `sizes`; eager past the largest)."""
    return law.step_ms(padded(running, sizes))


def decode_cap(law: DecodeLaw, buckets: Sequence[int], itl_ms: float) -> int:
    """The most running requests whose padded step fits in itl_ms; 0 when none does."""
    return max((b for b in buckets if law.step_ms(b) <= itl_ms), default=0)


def fine_buckets(top: int) -> list[int]:
    """A graph for every batch size up to top: no padding at all."""
    return list(range(1, top + 1))


def poisson_pmf(mean: float) -> list[float]:
    """P(N = n) for n = 0 .. far into the tail (mean + 12 sd)."""
    if mean <= 0:
        return [1.0]
    top = int(mean + 12 * math.sqrt(mean) + 20)
    log_mean = math.log(mean)
    return [math.exp(n * log_mean - mean - math.lgamma(n + 1)) for n in range(top + 1)]


def quantile(pmf: Sequence[float], q: float) -> int:
    total = 0.0
    for n, p in enumerate(pmf):
        total += p
        if total >= q:
            return n
    return len(pmf) - 1


@dataclass(frozen=True)
class DecodePrediction:
    mean_running: float  # R: the time-average running requests of one decode
    overflow: float  # share of the time above the cap
    itl_ms: dict[float, float]  # quantile -> ms
    mean_step_ms: float

    @property
    def within_cap(self) -> bool:
        return self.overflow <= SLOT_OVERFLOW


def predict_decode(
    law: DecodeLaw,
    buckets: Sequence[int],
    cap: int,
    rate: float,
    mean_output: float,
    quantiles: Sequence[float],
) -> DecodePrediction | None:
    """One decode under `rate` requests/s; None when its running count cannot settle inside
    the cap (the load outgrows what the ITL target allows)."""
    steps = mean_output / law.accept_len
    sizes = sorted(buckets)

    seen: dict[int, float] = {}

    def seen_step(n: int) -> float:
        """The step a token generated beside n other requests takes."""
        if n not in seen:
            seen[n] = step_at(law, sizes, n + 1)
        return seen[n]

    running = 0.0
    step = seen_step(0)
    for _ in range(_FIXED_POINT_ROUNDS):
        step = sum(p * seen_step(n) for n, p in enumerate(poisson_pmf(running)))
        nxt = rate * steps * step / 1000.0
        if nxt > cap:
            return None
        if abs(nxt - running) < 1e-9 * max(1.0, nxt):
            running = nxt
            break
        running = nxt
    else:
        return None
    pmf = poisson_pmf(running)
    overflow = max(0.0, 1.0 - sum(pmf[: cap + 1]))
    itl = {q: seen_step(quantile(pmf, q)) for q in quantiles}
    return DecodePrediction(running, overflow, itl, step)


@dataclass(frozen=True)
class StepInProgress:
    """The decode step under way when a request's KV lands. SGLang's decode scheduler takes
    transferred requests once per iteration (disaggregation/decode.py: process_decode_queue
    polls the transfer queue, then get_next_disagg_decode_batch_to_run streams the first
    token and merges the request into the running batch), so the first token waits for the
    rest of that step: nothing at idle, else a uniform share of the step at the running
    count, which a landing sees at its time average, Poisson(R)."""

    cumulative: list[float]  # P(running <= n)
    step_ms: list[float]  # the step at n running; 0 at n = 0 (idle)

    @staticmethod
    def of(law: DecodeLaw, buckets: Sequence[int], running: float) -> StepInProgress:
        sizes = sorted(buckets)
        pmf = poisson_pmf(running)
        steps = [0.0] + [step_at(law, sizes, n) for n in range(1, len(pmf))]
        return StepInProgress(list(accumulate(pmf)), steps)

    def waits_ms(self, draws: Sequence[tuple[float, float]]) -> list[float]:
        """The wait for each pair of uniform draws: u picks the running count, v how far
        into its step the KV lands."""
        cumulative, steps, top = self.cumulative, self.step_ms, len(self.step_ms) - 1
        return [v * steps[min(bisect.bisect_left(cumulative, u), top)] for u, v in draws]

    @property
    def mean_ms(self) -> float:
        pmf = [b - a for a, b in zip([0.0, *self.cumulative], self.cumulative, strict=False)]
        return sum(p * s / 2 for p, s in zip(pmf, self.step_ms, strict=True))


def sample_quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of equally likely values (linear interpolation, as numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
