"""What one sweep level asks for, and where it sends it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdctl.errors import PdctlError

# bench_serving's --backend names for the two OpenAI routes.
BACKENDS = {"completions": "sglang-oai", "chat": "sglang-oai-chat"}


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
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    seed: int


def default_num_prompts(concurrency: int) -> int:
    """The seed's 8 / 48 / 96 prompts at C = 1 / 16 / 64: 12·√C, at least 1.5·C.

    At least 1.5·C so that most of a level runs at full concurrency rather than ramping down.
    """
    if concurrency <= 1:
        return 8
    return max(round(12 * math.sqrt(concurrency)), math.ceil(1.5 * concurrency))


def parse_int_list(value: str, option: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise PdctlError(f"{option} {value!r}: give comma-separated integers") from e
    if not items or min(items) < 1:
        raise PdctlError(f"{option} {value!r}: give positive integers")
    return items


def build_levels(
    concurrency: str,
    num_prompts: str | None,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
) -> list[Level]:
    levels = parse_int_list(concurrency, "--concurrency")
    if num_prompts is None:
        counts = [default_num_prompts(c) for c in levels]
    else:
        counts = parse_int_list(num_prompts, "--num-prompts")
        if len(counts) == 1:
            counts *= len(levels)
        elif len(counts) != len(levels):
            raise PdctlError(
                f"--num-prompts has {len(counts)} values for {len(levels)} concurrency levels"
            )
    # Each level gets its own prompts (seed + index), the same on every run.
    return [
        Level(c, n, input_len, output_len, range_ratio, seed + i)
        for i, (c, n) in enumerate(zip(levels, counts, strict=True))
    ]
