"""What one sweep level asks for, and where it sends it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdctl.errors import PdctlError

# bench_serving's --backend names for the two OpenAI routes.
BACKENDS = {"completions": "sglang-oai", "chat": "sglang-oai-chat"}
DEFAULT_CONCURRENCY = "1,16,64"
RATE_SECONDS = 30  # an open-loop level's default length in arrivals


@dataclass(frozen=True)
class Target:
    url: str  # the gateway (or one engine) that takes the requests
    model: str
    endpoint: str  # completions | chat
    metrics_urls: tuple[str, ...] = ()  # engine /metrics sampled while a level runs
    api_key: str | None = field(default=None, repr=False)  # the gateway's, sent as a Bearer

    @property
    def headers(self) -> dict[str, str]:
        """For requests to `url` only: engine /metrics never see the key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Level:
    concurrency: int | None  # requests in flight at most; None: no cap (an open-loop level)
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    seed: int
    rate: float | None = None  # requests/s with Poisson arrivals; None: all at once

    @property
    def label(self) -> str:
        return f"{self.rate:g} req/s" if self.rate is not None else f"C={self.concurrency}"


def default_num_prompts(concurrency: int) -> int:
    """The seed's 8 / 48 / 96 prompts at C = 1 / 16 / 64: 12·√C, at least 1.5·C.

    At least 1.5·C so that most of a level runs at full concurrency rather than ramping down.
    """
    if concurrency <= 1:
        return 8
    return max(round(12 * math.sqrt(concurrency)), math.ceil(1.5 * concurrency))


def default_rate_prompts(rate: float) -> int:
    """About RATE_SECONDS of arrivals, and never fewer than a C=1 level's prompts."""
    return max(math.ceil(RATE_SECONDS * rate), default_num_prompts(1))


def parse_rates(value: str) -> list[float]:
    try:
        items = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or not all(0 < r < math.inf for r in items):
        raise PdctlError(f"--rate {value!r}: give comma-separated request rates above 0")
    return items


def parse_int_list(value: str, option: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise PdctlError(f"{option} {value!r}: give comma-separated integers") from e
    if not items or min(items) < 1:
        raise PdctlError(f"{option} {value!r}: give positive integers")
    return items


def build_levels(
    concurrency: str | None,
    num_prompts: str | None,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    rate: str | None = None,
) -> list[Level]:
    """Closed-loop levels (at most C in flight) or, with `rate`, open-loop ones (Poisson
    arrivals at each rate, nothing capping the requests in flight)."""
    if rate is not None and concurrency is not None:
        raise PdctlError("give --concurrency or --rate, not both")
    if rate is not None:
        rates = parse_rates(rate)
        shapes: list[tuple[int | None, float | None]] = [(None, r) for r in rates]
        defaults = [default_rate_prompts(r) for r in rates]
        what = "rates"
    else:
        caps = parse_int_list(concurrency or DEFAULT_CONCURRENCY, "--concurrency")
        shapes = [(c, None) for c in caps]
        defaults = [default_num_prompts(c) for c in caps]
        what = "concurrency levels"
    if num_prompts is None:
        counts = defaults
    else:
        counts = parse_int_list(num_prompts, "--num-prompts")
        if len(counts) == 1:
            counts *= len(shapes)
        elif len(counts) != len(shapes):
            raise PdctlError(f"--num-prompts has {len(counts)} values for {len(shapes)} {what}")
    # Each level gets its own prompts (seed + index), the same on every run.
    return [
        Level(c, n, input_len, output_len, range_ratio, seed + i, r)
        for i, ((c, r), n) in enumerate(zip(shapes, counts, strict=True))
    ]
