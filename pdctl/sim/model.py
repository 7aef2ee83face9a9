"""Performance model, fake tokenizer and fake text of the simulated engine.

Decode step time follows the seed's production fit `a + b * padded_batch` (ms), where
padded_batch is the smallest captured CUDA-graph bucket >= running requests (SGLang pads a
batch up to the next captured graph, hence the throughput sawtooth). A batch larger than
the largest bucket runs eager: `(a + b * running) * eager_penalty`.

Tokenizer (documented in docs/sim.md): a text counts `max(1, ceil(chars / 4))` tokens; a
list of token ids counts its length. Output tokens are words drawn from a fixed vocabulary
by a generator seeded with (seed, request key), so the same request gives the same text.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from dataclasses import dataclass

# Fake words: consonant + vowel syllables ("ba", "ken", "tor", ...).
_VOCAB = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "an", "en", "or")]


# Fake token ids: word i of the vocabulary is token FIRST_WORD_ID + i (ids below are special).
FIRST_WORD_ID = 1000
VOCAB_SIZE = len(_VOCAB)


def token_text(token_id: int) -> str:
    return _VOCAB[token_id - FIRST_WORD_ID] + " "


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


class FakeText:
    """The fake model's output for one request: token ids of words (`token_text`, each
    followed by a space) from a generator seeded with (seed, key)."""

    def __init__(self, seed: int, key: str) -> None:
        self._rng = random.Random(f"{seed}:{key}")

    def next_id(self) -> int:
        return FIRST_WORD_ID + self._rng.randrange(len(_VOCAB))


def padded_batch(running: int, buckets: list[int]) -> int | None:
    """Smallest captured bucket >= running, or None when the batch must run eager."""
    i = bisect.bisect_left(buckets, running)
    return buckets[i] if i < len(buckets) else None


@dataclass(frozen=True)
class StepModel:
    a_ms: float
    b_ms: float
    eager_penalty: float
    buckets: list[int]

    def decode_step_ms(self, running: int) -> tuple[float, bool]:
        """(step time in ms, ran in a CUDA graph)."""
        padded = padded_batch(running, self.buckets)
        if padded is None:
            return (self.a_ms + self.b_ms * running) * self.eager_penalty, False
        return self.a_ms + self.b_ms * padded, True

    def throughput(self, running: int) -> float:
        """Aggregate decode tokens/s at a steady `running` batch."""
        ms, _ = self.decode_step_ms(running)
        return running * 1000.0 / ms


class Clock:
    """Simulated time: wall time divided by the time scale (PDSIM_TIME_SCALE)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    async def sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(max(sim_seconds, 0.0) * self.scale)

    def wall(self, sim_seconds: float) -> float:
        return sim_seconds * self.scale


# A forward issued later than this after the last one ended starts late: a stalled process
# is not caught up in a burst of instant steps.
MAX_LAG_S = 0.5


class GPUTimeline:
    """The simulated GPU's forwards, back to back while the scheduler stays busy.

    A forward issued right after the last one starts where that one ended, so a loaded test
    machine's late timer wake-ups and slow Python between steps do not stretch GPU time (an
    overlapped SGLang scheduler hides its CPU work behind the GPU likewise). The scheduler
    calls `idle()` when it waits for work: a forward after that starts when it is issued.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._end: float | None = None
        self.busy_s = 0.0  # forward time so far (the device timer's GPU time)

    def idle(self) -> None:
        self._end = None

    async def forward(self, sim_seconds: float) -> float:
        """Run a forward; the simulated time it ended at."""
        now = self.clock.now()
        start = now if self._end is None else max(self._end, now - MAX_LAG_S)
        end = self._end = start + sim_seconds
        self.busy_s += sim_seconds
        await self.clock.sleep(end - now)
        return end


class KVPool:
    """Token slots of the KV cache; a request reserves its prompt plus its output budget."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0

    def try_reserve(self, tokens: int) -> bool:
        if self.used + tokens > self.size:
            return False
        self.used += tokens
        return True

    def release(self, tokens: int) -> None:
        self.used = max(self.used - tokens, 0)
