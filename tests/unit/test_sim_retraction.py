"""Decode retraction in the sim, as SGLang 0.5.23's decode server does it: a pool too small for
the admitted requests at full length retracts the newest ones (fewest output tokens) back to
the retracted queue, counts them on every TP rank, logs SGLang's warning, and resumes them; the
clients get the same answers as without pressure."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdctl.sim.args import resolve
from pdctl.sim.metrics import NoMetrics, SimMetrics
from pdctl.sim.mode import DisaggregationMode
from pdctl.sim.req import Req
from pdctl.sim.sampling import Sampler, SamplingParams
from pdctl.sim.scheduler_decode import DecodeScheduler
from pdctl.testing.stack import free_port, in_process

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}
TP = 4
REQUESTS = 6
MAX_NEW = 60
RETRACT = re.compile(
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), "
    r"#new_tokens_gained: \d+, #new_token_ratio: \d\.\d{4} -> \d\.\d{4}$"
)


async def serve(pool: int | None) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """REQUESTS concurrent PD requests through one prefill and one TP4 decode whose KV pool
    holds `pool` tokens (None: the derived size). The answers and the decode's counters."""
    port = free_port()
    env = {**FAST, **({"PDSIM_KV_POOL_TOKENS": str(pool)} if pool else {})}
    decode_args = ("--enable-metrics", "--tp-size", str(TP), "--decode-log-interval", "1")
    async with (
        in_process("prefill", FAST, "--enable-metrics", bootstrap_port=port) as prefill,
        in_process("decode", env, *decode_args, "--num-reserved-decode-tokens", "4") as decode,
        aiohttp.ClientSession() as http,
    ):

        async def one(room: int) -> dict[str, Any]:
            body = {
                "text": "retract me under decode memory pressure",
                "rid": f"r{room}",
                "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True},
                "bootstrap_host": "127.0.0.1",
                "bootstrap_port": port,
                "bootstrap_room": room,
            }
            legs = [http.post(f"{s.url}/generate", json=body) for s in (prefill, decode)]
            _, answer = await asyncio.gather(*legs)
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())

        answers = list(await asyncio.gather(*(one(room) for room in range(1, REQUESTS + 1))))
        async with http.get(f"{decode.url}/metrics") as resp:
            text = await resp.text()
    counters: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("sglang:num_retracted"):
                counters.setdefault(s.name, {})[s.labels.get("tp_rank", "")] = s.value
    return answers, counters


def test_a_full_decode_pool_retracts_and_resumes(capsys: pytest.CaptureFixture[str]) -> None:
    calm, calm_counters = asyncio.run(serve(None))
    # 6 requests of 10 prompt + 60 output tokens need 420 slots at full length.
    squeezed, counters = asyncio.run(serve(200))
    out = capsys.readouterr().out.splitlines()

    assert [a["text"] for a in squeezed] == [a["text"] for a in calm]
    assert all(a["meta_info"]["completion_tokens"] == MAX_NEW for a in squeezed)
    assert not any(name.endswith("_total") for name in calm_counters)

    retracted = sum(int(m[1]) for ln in out if (m := RETRACT.search(ln)))
    assert retracted > 0
    ranks = {str(r) for r in range(TP)}
    # Counted by every rank (increment_retracted_reqs under plain enable_metrics).
    assert counters["sglang:num_retracted_requests_total"] == dict.fromkeys(ranks, retracted)
    assert set(counters["sglang:num_retracted_input_tokens_total"]) == ranks
    assert set(counters["sglang:num_retracted_output_tokens_total"]) == ranks
    # The gauge is rank 0's log_stats value.
    assert set(counters["sglang:num_retracted_reqs"]) == {"0"}
    waiting = [int(m[1]) for ln in out if (m := re.search(r"#retracted-req: (\d+)", ln))]
    assert max(waiting) > 0 and waiting[-1] == 0


def test_the_gauge_holds_the_last_retraction_until_the_next_stats_line() -> None:
    """scheduler.update_running_batch sets metrics_reporter.num_retracted_reqs to each
    retraction's count (it does not add them up); the next stats line publishes it and resets
    it, and nothing else writes the gauge (an idle SGLang republishes its last stats)."""
    cfg = resolve(
        ["--model-path", "/m", "--disaggregation-mode", "decode", "--enable-metrics"],
        {"PDSIM_KV_POOL_TOKENS": "95"},
    )
    metrics = SimMetrics("sim", DisaggregationMode.DECODE)
    engine = DecodeScheduler(cfg, metrics, logging.getLogger("test"))

    def gauge() -> float | None:
        labels = {**metrics.sched, **metrics.pid}
        return metrics.registry.get_sample_value("sglang:num_retracted_reqs", labels)

    def run(n: int) -> None:
        """n running requests holding 50 tokens in 20 reserved slots: each needs 30 more."""
        for i in range(n):
            req = Req(f"r{i}", 10, 100, "length", False, Sampler(SamplingParams(), 0, ""), 0.0)
            req.generated, req.reserved = 40, 20
            engine.pool.try_reserve(20)
            engine.running.append(req)

    run(3)
    engine._retract(1)  # 35 slots free for 90 needed: two leave
    assert len(engine.retracted) == 2
    engine.pool.release(engine.pool.used)
    engine.running = []
    run(2)
    engine._retract(1)  # 55 free for 60 needed: one leaves
    assert len(engine.retracted) == 3
    engine._update_gauges()
    assert gauge() == 1
    engine._update_gauges()
    assert gauge() == 0


async def steps_after_the_retraction(offset: int, excess: int) -> int | None:
    """Two requests of 24 output tokens that need `excess` slots more than the pool holds at
    full length, the second joining the batch `offset` steps after the first: the decode steps
    from the retraction to the idle (None: no retraction)."""
    cfg = resolve(
        ["--model-path", "/m", "--disaggregation-mode", "decode"],
        {"PDSIM_KV_POOL_TOKENS": "1600", "PDSIM_TIME_SCALE": "0.0001"},
    )
    engine = DecodeScheduler(cfg, NoMetrics("sim", cfg.mode), logging.getLogger("test"))
    max_new = 24
    prompt = (1600 + excess) // 2 - max_new + 1

    def join(rid: str) -> None:
        req = Req(rid, prompt, max_new, "length", False, Sampler(SamplingParams(), 0, ""), 0.0)
        engine.pool.try_reserve(prompt)
        req.reserved = prompt
        engine.start_decoding(req)
        engine._before_decode()  # the scheduler's next iteration takes it into the batch

    join("first")
    for _ in range(offset):
        await engine._decode_step()
    join("second")
    retracted_at = None
    while True:  # Scheduler.run's decode path, until the decode idles
        engine.running = [r for r in engine.running if not r.done]
        engine._before_decode()
        if not engine.running:
            break
        before = len(engine.retracted)
        await engine._decode_step()
        if len(engine.retracted) > before:
            retracted_at = engine.forward_ct_decode
    return None if retracted_at is None else engine.forward_ct_decode - retracted_at


@pytest.mark.parametrize("offset", range(6))
def test_a_pair_over_the_pool_retracts_a_few_steps_before_the_end(offset: int) -> None:
    """What the live test's retraction gauge plant relies on: after the retraction the decode
    runs what both requests have left less one step, the excess plus the slot left free (0 or
    1: the parity of their offset) less one; an offset as large as the excess leaves no
    retraction (the first request finishes and frees its KV before the pool runs out)."""
    want = 4 - 1 + offset % 2 if offset < 4 else None
    assert asyncio.run(steps_after_the_retraction(offset, excess=4)) == want
