"""pdctl.sim performance model: graph bucket padding, eager batches, KV pool, fake text, the
GPU timeline."""

from __future__ import annotations

import asyncio

import pytest

from pdctl.sim.args import default_decode_buckets
from pdctl.sim.model import (
    MAX_LAG_S,
    FakeText,
    GPUTimeline,
    KVPool,
    StepModel,
    count_tokens,
    padded_batch,
    token_text,
)

STEP8 = list(range(8, 97, 8))  # the seed's first bucket list: 8, 16, ..., 96


def test_default_buckets_are_sglangs_list() -> None:
    # arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes
    assert default_decode_buckets(32) == [1, 2, 4, 8, 12, 16, 24, 32]
    assert default_decode_buckets(100) == [1, 2, 4, 8, 12, *range(16, 97, 8), 100]
    buckets = default_decode_buckets(512)
    assert buckets[-3:] == [480, 496, 512]
    assert 256 in buckets and 264 not in buckets and 272 in buckets


@pytest.mark.parametrize(("running", "padded"), [(1, 8), (8, 8), (9, 16), (57, 64), (96, 96)])
def test_padded_batch_is_smallest_bucket_at_or_above(running: int, padded: int) -> None:
    assert padded_batch(running, STEP8) == padded


def test_batches_above_the_largest_graph_run_eager() -> None:
    assert padded_batch(97, STEP8) is None
    model = StepModel(18.0, 1.05, 3.0, STEP8)
    assert model.decode_step_ms(96) == (pytest.approx(18 + 1.05 * 96), True)
    assert model.decode_step_ms(97) == (pytest.approx((18 + 1.05 * 97) * 3.0), False)


def test_bucket_padding_makes_the_seed_sawtooth() -> None:
    model = StepModel(18.0, 1.05, 3.0, STEP8)
    # 56 runs in the 56-wide graph, 57 pays for 64: aggregate throughput drops.
    assert model.throughput(57) < model.throughput(56)
    # Finer buckets where traffic concentrates remove the drop.
    fine = StepModel(18.0, 1.05, 3.0, list(range(1, 97)))
    assert fine.throughput(57) > fine.throughput(56)


def test_seed_asymptote_is_near_950_tokens_per_second() -> None:
    model = StepModel(18.0, 1.05, 3.0, list(range(1, 1025)))
    assert 900 < model.throughput(1024) < 1000 / 1.05


def test_kv_pool_reserves_and_releases() -> None:
    pool = KVPool(100)
    assert pool.try_reserve(60)
    assert not pool.try_reserve(41)
    assert pool.used == 60
    pool.release(60)
    assert pool.used == 0


def test_tokenizer_counts_four_characters_per_token() -> None:
    assert count_tokens("") == 1
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2


def test_fake_text_is_deterministic_per_seed_and_key() -> None:
    def words(seed: int, key: str) -> list[str]:
        text = FakeText(seed, key)
        return [token_text(text.next_id()) for _ in range(20)]

    assert words(1, "a") == words(1, "a")
    assert words(1, "a") != words(2, "a")
    assert words(1, "a") != words(1, "b")
    assert all(w.endswith(" ") for w in words(1, "a"))


class LateClock:
    """Simulated time that moves only in sleeps, each woken `lag` late (a loaded machine)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.lag = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0) + self.lag


def test_back_to_back_forwards_keep_gpu_time_on_a_late_machine() -> None:
    clock = LateClock()
    clock.lag = 0.012
    gpu = GPUTimeline(clock)  # type: ignore[arg-type]

    async def steps() -> None:
        for _ in range(50):
            await gpu.forward(0.065)

    asyncio.run(steps())
    # Each wake-up is late, but the next forward starts where the last one ended.
    assert clock.t == pytest.approx(50 * 0.065 + 0.012, abs=1e-9)


def test_a_forward_after_idle_or_a_long_stall_starts_when_issued() -> None:
    clock = LateClock()
    gpu = GPUTimeline(clock)  # type: ignore[arg-type]

    async def steps() -> None:
        await gpu.forward(0.1)
        clock.t += 0.3  # the scheduler waited for work: the GPU was idle, nothing to catch up
        gpu.idle()
        await gpu.forward(0.1)
        assert clock.t == pytest.approx(0.5)
        clock.t += 3 * MAX_LAG_S  # a stall: only MAX_LAG_S of it is caught up, not all of it
        resumed = clock.t
        for _ in range(10):
            await gpu.forward(0.1)
        assert clock.t - resumed == pytest.approx(1.0 - MAX_LAG_S)

    asyncio.run(steps())
