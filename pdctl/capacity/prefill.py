"""TTFT: one prefill's batching queue under Poisson arrivals, then the PD handoff.

A prefill batches what has queued when it becomes free: the oldest request always, then the
next ones in order while their prompts fit in `--chunked-prefill-size` tokens (SGLang's
PrefillAdder and the sim's scheduler stop at the first one that does not; SGLang would chunk
it instead, which costs the same tokens). A batch takes `a + b x its tokens` ms (the prefill
law), and every request in it is done when the batch ends: batching saves `a` per request
but makes the first wait for the others' tokens. No closed form covers that queue, so it is
simulated: SAMPLES arrivals drawn once per plan and prefill count (common random numbers, so
a higher rate is not luckier than a lower one), the lengths drawn from the workload's. The
gateway deals Poisson arrivals out to n prefills: `round_robin` (the profile's default) gives
each every n-th, gaps of Gamma(n) (steadier than Poisson); `random` a Poisson share, the
bound for load-aware policies too.

After its batch a request's KV moves to its decode and the decode sends the first token:
`Handoff` — a fixed part (the decode's room bootstrap, the KV-arrival notice, the gateway
hop: `--handoff-ms`, measured on the stack at idle, docs/bench.md) and the transfer
(prompt tokens x KV bytes per token / link bandwidth). Both per GPU: with equal TP sizes each
decode TP rank pulls its own KV shard (MLA: its replica) from one prefill rank, all ranks at
once (SGLang's CommonKVManager._resolve_rank_mapping, disaggregation/common/conn.py), so a
request's transfer is one rank's bytes over one rank's path, not TP times that. Then the
first token waits for the decode step under way (model.StepInProgress): the decode's load
enters TTFT there.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

from pdctl.capacity.model import PrefillLaw, StepInProgress, sample_quantile

SAMPLES = 6000
MAX_UTILISATION = 0.95  # a prefill busier than this is one burst away from an endless queue
SEED = 22
Policy = Literal["round_robin", "random"]


@dataclass(frozen=True)
class Handoff:
    fixed_ms: float = 0.0
    ms_per_token: float = 0.0  # KV transfer: bytes per token / link bytes per ms

    @staticmethod
    def of(fixed_ms: float, kv_bytes_per_token: int, link_gb_s: float | None) -> Handoff:
        per_token = kv_bytes_per_token / (link_gb_s * 1e6) if link_gb_s else 0.0
        return Handoff(fixed_ms, per_token)

    def ms(self, tokens: int) -> float:
        return self.fixed_ms + self.ms_per_token * tokens


@dataclass(frozen=True)
class PrefillSide:
    law: PrefillLaw
    chunk_tokens: int  # --chunked-prefill-size: the most prompt tokens one batch takes
    handoff: Handoff

    def alone_ms(self, tokens: int) -> float:
        """TTFT of a request that finds the prefill idle."""
        return self.law.batch_ms(tokens) + self.handoff.ms(tokens)


@dataclass
class Arrivals:
    """What one of n prefills receives: arrival times at a total rate of 1 request per unit
    of time, and the prompt length of each arrival."""

    lengths: Sequence[int]
    policy: Policy = "round_robin"
    samples: int = SAMPLES
    _drawn: dict[int, tuple[list[float], list[int]]] = field(default_factory=dict)

    def draws(self, prefills: int) -> list[tuple[float, float]]:
        """Uniform pairs for each arrival's wait for the decode step under way (a stream of
        their own, so the arrivals and lengths stay as drawn without them)."""
        return wait_draws(self.samples, f"{SEED}:{prefills}:step")

    def of(self, prefills: int) -> tuple[list[float], list[int]]:
        if prefills not in self._drawn:
            rng = random.Random(f"{SEED}:{prefills}")
            if self.policy == "round_robin":
                gaps = (rng.gammavariate(prefills, 1.0) for _ in range(self.samples))
            else:
                gaps = (rng.expovariate(1.0) * prefills for _ in range(self.samples))
            lengths = [self.lengths[rng.randrange(len(self.lengths))] for _ in range(self.samples)]
            self._drawn[prefills] = (list(accumulate(gaps)), lengths)
        return self._drawn[prefills]


def wait_draws(n: int, seed: str) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(rng.random(), rng.random()) for _ in range(n)]


def step_waits(
    decode: StepInProgress | None, draws: Sequence[tuple[float, float]]
) -> list[float] | None:
    return None if decode is None else decode.waits_ms(draws)


@dataclass(frozen=True)
class PrefillPrediction:
    utilisation: float
    mean_wait_ms: float  # queueing before its batch starts
    mean_batch: float  # requests per batch
    ttft_ms: dict[float, float]  # quantile -> ms


@dataclass(frozen=True)
class Served:
    ttft_ms: list[float]  # per request, in arrival order
    utilisation: float
    mean_wait_ms: float
    mean_batch: float


def serve(
    side: PrefillSide,
    at_ms: Sequence[float],
    inputs: Sequence[int],
    step_wait_ms: Sequence[float] | None = None,
) -> Served:
    """One prefill's queue over requests arriving at `at_ms` (sorted) with these prompts;
    `step_wait_ms`: each one's wait for the decode step under way when its KV lands."""
    a, b, chunk = side.law.a_ms, side.law.b_ms, side.chunk_tokens
    n = len(at_ms)
    ttft: list[float] = []
    busy = wait = free_at = 0.0
    batches = i = 0
    while i < n:
        start = max(free_at, at_ms[i])
        tokens, j = inputs[i], i + 1
        while j < n and at_ms[j] <= start and tokens + inputs[j] <= chunk:
            tokens += inputs[j]
            j += 1
        end = start + a + b * tokens
        for k in range(i, j):
            wait += start - at_ms[k]
            extra = step_wait_ms[k] if step_wait_ms is not None else 0.0
            ttft.append(end - at_ms[k] + side.handoff.ms(inputs[k]) + extra)
        busy += end - start
        free_at, i, batches = end, j, batches + 1
    return Served(ttft, busy / max(free_at, at_ms[-1], 1e-9), wait / n, n / batches)


def predict_prefill(
    side: PrefillSide,
    arrivals: Arrivals,
    rate: float,
    prefills: int,
    quantiles: Sequence[float],
    decode: StepInProgress | None = None,
) -> PrefillPrediction | None:
    """One of `prefills` prefills sharing `rate` requests/s, its requests' first tokens
    waiting for `decode`'s step under way; None above MAX_UTILISATION."""
    unit_times, inputs = arrivals.of(prefills)
    waits = step_waits(decode, arrivals.draws(prefills))
    served = serve(side, [t * 1000.0 / rate for t in unit_times], inputs, waits)
    if served.utilisation > MAX_UTILISATION:
        return None
    ttft = sorted(served.ttft_ms)
    return PrefillPrediction(
        served.utilisation,
        served.mean_wait_ms,
        served.mean_batch,
        {q: sample_quantile(ttft, q) for q in quantiles},
    )


def replay(
    side: PrefillSide,
    at_ms: Sequence[float],
    inputs: Sequence[int],
    prefills: int,
    decode: StepInProgress | None = None,
    seed: str = "replay",
) -> list[float]:
    """TTFTs of a given arrival sequence dealt round-robin to `prefills` prefills: the model
    on one run's own arrivals, apart from how typical those arrivals were (the decode step
    under way is still drawn, from `seed`)."""
    waits = step_waits(decode, wait_draws(len(at_ms), f"{SEED}:{seed}"))
    out: list[float] = []
    for p in range(prefills):
        mine = None if waits is None else waits[p::prefills]
        out += serve(side, at_ms[p::prefills], inputs[p::prefills], mine).ttft_ms
    return out
