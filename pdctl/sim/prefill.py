"""The prefill leg of a PD request (SGLang's `disaggregation/prefill.py`).

The room waits in the bootstrap queue until its decode bootstraps it (bounded by
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), is prefilled, then its KV goes out through the
backend's sender (conn.py, nixl_conn.py) and the room turns Success; the leg answers with the
first token. On the nixl backend a room whose decode agent the prefill's peer table lacks
fails as SGLang's transfer worker fails it ("KV transfer failed"), and a WRITE that fails
fails the room with NIXL's text.

Degraded pair (PDSIM_DEGRADED=on, a modelled failure): a prefill that saw its decode
re-register with a new session keeps stale metadata, and PDSIM_DEGRADED_FAIL_RATIO of its
rooms fail or hang until both sides restart. Real NIXL over host memory shows no such
failure (docs/sim.md).
"""

from __future__ import annotations

import asyncio
import logging

from .args import SimConfig
from .bootstrap import BootstrapServer, Room
from .conn import KVPoll, KVSender, KVTransferFailed
from .metrics import SimMetrics
from .pd_failures import degraded_draw, fail_transfer
from .req import Req
from .scheduler_prefill import PrefillScheduler


class PrefillLeg:
    def __init__(
        self,
        cfg: SimConfig,
        engine: PrefillScheduler,
        boot: BootstrapServer,
        metrics: SimMetrics,
        log: logging.Logger,
        sender: KVSender,
    ) -> None:
        self.cfg, self.engine, self.boot, self.metrics, self.log = cfg, engine, boot, metrics, log
        self.sender = sender

    def _fail(self, req: Req, phase: str, reason: str) -> None:
        fail_transfer(self.engine, self.log, req, f"Prefill {phase}", "req", reason)

    async def run(self, req: Req) -> None:
        assert req.room is not None
        clock, k, m = self.engine.clock, self.cfg.knobs, self.metrics
        room = self.boot.room(req.room)
        t0 = clock.now()
        try:
            with self.engine.in_bootstrap_queue(req):
                await asyncio.wait_for(room.bootstrapped.wait(), clock.wall(k.bootstrap_timeout_s))
        except TimeoutError:
            elapsed = clock.now() - t0
            reason = f"Request {req.room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            room.conclude(KVPoll.Failed, reason)
            m.rank_inc(m.num_bootstrap_failed_reqs)
            self._fail(req, "bootstrap", reason)
            return
        bootstrap_ms = (clock.now() - t0) * 1000
        m.rank_observe(m.per_stage_req_latency, clock.now() - t0, stage="prefill_bootstrap")
        if req.done:  # the client went away while the room bootstrapped
            room.conclude(KVPoll.Failed, "Aborted by AbortReq.")
            return
        self.engine.submit_prefill(req)
        await req.prefilled.wait()
        if req.done:  # aborted or cancelled while queued
            room.conclude(KVPoll.Failed, "Aborted by AbortReq.")
            return
        t1 = clock.now()
        room.start_transfer()
        try:
            sent = await self.sender.send(req, room.session_id or "", room.dst_offset)
        except KVTransferFailed as e:
            self._transfer_failed(req, room, str(e))
            return
        if self.boot.is_degraded(room) and degraded_draw(k.seed, req.room, k.degraded_fail_ratio):
            if k.degraded_hangs:
                # The KV never arrives; the decode's waiting timeout ends the request.
                await self._hang(req, t0)
                return
            self._transfer_failed(
                req, room, "Failed to transfer KV: stale decode metadata (peer restarted alone)"
            )
            return
        room.conclude(KVPoll.Success)
        m.rank_observe(m.per_stage_req_latency, clock.now() - t1, stage="prefill_transfer_kv_cache")
        m.observe_kv_transfer(sent.nbytes, sent.seconds)
        # compute_and_observe_kv_transfer_metrics: bootstrap and alloc with the transfer;
        # the sim's prefill allocates as soon as the room bootstraps.
        m.rank_observe(m.kv_transfer_bootstrap_ms, bootstrap_ms)
        m.rank_observe(m.kv_transfer_alloc_ms, 0.0)
        self.engine.complete_prefill(req)

    def _transfer_failed(self, req: Req, room: Room, reason: str) -> None:
        room.conclude(KVPoll.Failed, reason)
        self.metrics.rank_inc(self.metrics.num_transfer_failed_reqs)
        self._fail(req, "transfer", reason)

    async def _hang(self, req: Req, t0: float) -> None:
        clock = self.engine.clock
        remaining = self.cfg.knobs.bootstrap_timeout_s - (clock.now() - t0)
        await clock.sleep(remaining)
        reason = (
            f"Request {req.room} timed out after {clock.now() - t0:.1f}s in KVPoll.Transferring"
        )
        self.boot.room(req.room or 0).conclude(KVPoll.Failed, reason)
        self._fail(req, "transfer", reason)
