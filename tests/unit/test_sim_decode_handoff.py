"""A decode takes a request whose KV has landed at its scheduler's next iteration, as SGLang
0.5.23's disaggregation/decode.py does (process_decode_queue polls the transfer queue once per
iteration, get_next_disagg_decode_batch_to_run streams the prefill's first token and merges
the request into the running batch): a first token never comes out during a decode step in
progress, and not at all while retracted requests wait to resume."""

from __future__ import annotations

import asyncio
import logging

from pdctl.sim.args import resolve
from pdctl.sim.metrics import NoMetrics
from pdctl.sim.req import Req
from pdctl.sim.sampling import Sampler, SamplingParams
from pdctl.sim.scheduler_decode import DecodeScheduler


def _engine() -> DecodeScheduler:
    cfg = resolve(
        ["--model-path", "/m", "--disaggregation-mode", "decode"],
        {"PDSIM_KV_POOL_TOKENS": "4000", "PDSIM_TIME_SCALE": "0.0001"},
    )
    return DecodeScheduler(cfg, NoMetrics("sim", cfg.mode), logging.getLogger("test"))


def _landed(engine: DecodeScheduler, rid: str, prompt: int = 100) -> Req:
    """A request whose KV is allocated and has just arrived."""
    req = Req(rid, prompt, 8, "length", False, Sampler(SamplingParams(), 0, ""), 0.0)
    engine.pool.try_reserve(prompt)
    req.reserved = prompt
    engine.start_transfer(req)
    engine.start_decoding(req)
    return req


async def _kv_lands_during_a_step() -> None:
    engine = _engine()
    first = _landed(engine, "first")
    assert first.generated == 0 and engine.disagg_queues().transfer == 1
    engine._before_decode()
    assert first.generated == 1 and engine.running == [first]
    step = asyncio.ensure_future(engine._decode_step())
    await asyncio.sleep(0)  # the step is under way
    second = _landed(engine, "second")
    await step
    assert (first.generated, second.generated) == (2, 0)
    assert engine.disagg_queues().transfer == 1  # still in the transfer queue
    engine._before_decode()  # the next iteration
    assert second.generated == 1 and engine.running == [first, second]
    assert engine.disagg_queues().transfer == 0
    await engine._decode_step()
    assert (first.generated, second.generated) == (3, 2)


def test_a_first_token_waits_for_the_decode_step_under_way() -> None:
    asyncio.run(_kv_lands_during_a_step())


def test_transferred_requests_wait_while_retracted_ones_cannot_resume() -> None:
    engine = _engine()
    stuck = Req("stuck", 5000, 8, "length", False, Sampler(SamplingParams(), 0, ""), 0.0)
    engine.retracted.append(stuck)  # its KV no longer fits the pool
    req = _landed(engine, "landed")
    engine._before_decode()
    assert req.generated == 0 and engine.running == []
    engine.retracted.clear()
    engine._before_decode()
    assert req.generated == 1 and engine.running == [req]


def test_a_request_cancelled_after_its_kv_landed_never_starts() -> None:
    engine = _engine()
    req = _landed(engine, "gone")
    engine.cancel(req)
    engine._before_decode()
    assert req.generated == 0 and engine.running == [] and engine.arrived == []
