"""Forced optimistic-prefill retries in the sim, as sglang 0.5.23's prefill server makes them
under SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB (disaggregation/prefill.py): the rids
the hash picks are prefilled twice; with an optimistic attempt left the retry yields and every
TP rank counts it, without one the request falls back to the bootstrap queue uncounted."""

from __future__ import annotations

import asyncio
import hashlib
import re

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdctl.sim.scheduler_prefill import forces_prefill_retry
from pdctl.testing.stack import free_port, in_process, pd_generate

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}
HOOK = "SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB"
TP = 4


def test_the_draw_is_sglangs_hash_of_the_rid() -> None:
    rids = [f"req-{i}" for i in range(200)]
    # should_force_retry: int(sha256(rid)[:8], big) < prob * 2**64
    picked = [r for r in rids if forces_prefill_retry(r, 0.25)]
    want = [
        r for r in rids if int.from_bytes(hashlib.sha256(r.encode()).digest()[:8], "big") < 2**62
    ]
    assert picked == want and 20 < len(picked) < 80
    assert all(forces_prefill_retry(r, 1.0) for r in rids)
    assert not any(forces_prefill_retry(r, 0.0) for r in rids)


async def pd_requests(
    rids: list[str], prefill_flags: tuple[str, ...], prob: float
) -> dict[str, float]:
    """One PD request per rid through a TP4 prefill with the hook at `prob`; the prefill's
    per-rank retry counter (absent when never written)."""
    port = free_port()
    env = {**FAST, HOOK: str(prob)}
    flags = ("--enable-metrics", "--tp-size", str(TP))
    async with (
        in_process("prefill", env, *flags, *prefill_flags, bootstrap_port=port) as prefill,
        in_process("decode", FAST, *flags) as decode,
        aiohttp.ClientSession() as http,
    ):

        async def one(room: int, rid: str) -> None:
            legs = await pd_generate(
                http, prefill.url, decode.url, port, room, text="prefill me twice",
                max_new_tokens=3, rid=rid,
            )  # fmt: skip
            for status, text in legs:
                assert status == 200, text

        await asyncio.gather(*(one(room, rid) for room, rid in enumerate(rids, 1)))
        async with http.get(f"{prefill.url}/metrics") as resp:
            text = await resp.text()
    retries: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sglang:num_prefill_retries_total":
                retries[s.labels["tp_rank"]] = s.value
    return retries


def run(rids: list[str], prefill_flags: tuple[str, ...], prob: float) -> dict[str, float]:
    return asyncio.run(asyncio.wait_for(pd_requests(rids, prefill_flags, prob), 60))


def test_a_forced_retry_yields_once_and_every_rank_counts_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rids = [f"retry-{i}" for i in range(12)]
    forced = [r for r in rids if forces_prefill_retry(r, 0.5)]
    assert 0 < len(forced) < len(rids)
    counters = run(rids, ("--optimistic-prefill-attempts", "2"), 0.5)
    out = capsys.readouterr().out
    yielded = re.findall(r"Req (\S+) optimistic prefill yielded \((\d+)/(\d+) attempts used\)", out)
    assert sorted(yielded) == sorted((r, "2", "2") for r in forced)
    assert "exhausted" not in out
    assert counters == {str(rank): float(len(forced)) for rank in range(TP)}
    # Each forced request is prefilled twice; the pass that forced it reports it pending.
    batches = re.findall(r"Prefill batch, #new-seq: (\d+).*#optimistic-req: (\d+)", out)
    assert sum(int(n) for n, _ in batches) >= len(rids) + len(forced)
    assert sum(int(o) for _, o in batches) == len(forced)


def test_without_an_attempt_left_a_forced_request_falls_back_uncounted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counters = run(["fallback-0", "fallback-1"], (), 1.0)
    out = capsys.readouterr().out
    for rid in ("fallback-0", "fallback-1"):
        assert (
            f"Req {rid} exhausted optimistic prefill attempts falling back to bootstrap queue"
            in out
        )
    assert "yielded" not in out
    assert not counters  # written at the first retry only
