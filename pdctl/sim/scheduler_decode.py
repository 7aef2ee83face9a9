"""A decode server's scheduler (SGLang's SchedulerDisaggregationDecodeMixin).

Queues: `prealloc` (waiting for KV pool space), `transfer` (waiting for the prefill's KV) and
`retracted`, besides `running`. A request whose KV has landed stays in `transfer` (as `arrived`)
until the scheduler's next iteration polls it, as SGLang 0.5.23's
`event_loop_normal/overlap_disagg_decode` do: `process_decode_queue` moves transferred requests
to the waiting queue once per iteration (not at all while retracted requests wait), then
`get_next_disagg_decode_batch_to_run` streams the prefill's first token
(`process_batch_result_prebuilt`) and merges them into the running batch before the next step.
So a first token whose KV lands during a decode step waits for that step to end.

It allocates as SGLang's DecodePreallocQueue does: the prompt at admission, then one slot per
token as it decodes. Admission keeps
`--num-reserved-decode-tokens` of headroom per active request and counts the running
requests' KV as retractable, so a decode can admit more than its pool holds at full length.
When the next step does not fit, it retracts as `Scheduler.update_running_batch` /
`ScheduleBatch.retract_decode` do: the requests with the fewest output tokens (then the
longest prompts) leave the batch until the rest fits, their KV backed up to host (`retracted`
queue, `#retracted-req`), and they resume with their output so far when space returns; the
client only sees a pause.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections import deque
from http import HTTPStatus

from .args import SimConfig
from .logs import DecodeStats
from .metrics import SimMetrics
from .req import Req
from .scheduler import DisaggQueues, LoadQueues, Scheduler

# sglang/srt/environ.py defaults: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION,
# SGLANG_RETRACT_DECODE_STEPS, SGLANG_INIT_NEW_TOKEN_RATIO (x schedule_conservativeness 1.0),
# SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR and SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600


# KVManager classes with supports_deferred_decode_kv_release (mooncake_tcp is mooncake here).
DEFERRING_BACKENDS = frozenset({"mooncake", "mooncake_tcp", "nixl", "mori"})


class DecodeScheduler(Scheduler):
    def __init__(self, cfg: SimConfig, metrics: SimMetrics, log: logging.Logger) -> None:
        super().__init__(cfg, metrics, log)
        self.prealloc: deque[Req] = deque()
        self.transfer: set[Req] = set()
        # In `transfer` with their KV landed, for the scheduler's next iteration to take.
        self.arrived: list[Req] = []
        # Retracted under KV pressure, KV backed up to host, waiting to resume.
        self.retracted: list[Req] = []
        # Retracted by /pause_generation retract, KV freed, until /continue_generation.
        self.held_for_rebootstrap: list[Req] = []
        # Failed transfers whose KV stays allocated until the prefill acks the abort.
        self.deferred: list[Req] = []
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._prealloc_changed = asyncio.Event()

    # ----- admission -----------------------------------------------------------------
    async def preallocate(self, req: Req) -> None:
        """Wait in the prealloc queue until the request's prompt fits with the decode
        headroom, then allocate the prompt's KV."""
        self.prealloc.append(req)
        try:
            while not req.done and not self._decode_admits(req):
                self._prealloc_changed.clear()
                await self._prealloc_changed.wait()
            if req.done:  # cancelled while waiting for space
                return
            self.pool.try_reserve(req.prompt_tokens)
            req.reserved = req.prompt_tokens
            req.admitted = self.clock.now()
        finally:
            self.prealloc.remove(req)

    def _decode_budget(self, count_retracted: bool) -> int:
        """_allocatable_token_budgets: free slots minus the headroom of every active request
        (and, for admission, what the retracted requests need to resume)."""
        reserve = self.cfg.args.num_reserved_decode_tokens
        budget = self.pool.size - self.pool.used - reserve * self._occupied()
        if count_retracted:
            budget -= sum(r.prompt_tokens + r.generated + reserve for r in self.retracted)
        return budget

    def _decode_admits(self, req: Req) -> bool:
        """_required_admission_tokens: the prompt plus headroom, or the whole (clipped) output
        less what retracting the running batch would free. The headroom is capped at the
        request's own output so that a small pool (PDSIM_KV_POOL_TOKENS) still serves."""
        if self._occupied() >= self.cfg.max_running_requests:
            return False
        retractable = sum(r.prompt_tokens + r.generated for r in self.running if not r.done)
        headroom = min(self.cfg.args.num_reserved_decode_tokens, req.max_new_tokens)
        need = max(
            req.prompt_tokens + headroom,
            req.prompt_tokens + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) - retractable,
        )
        return self._decode_budget(count_retracted=True) >= need

    def start_transfer(self, req: Req) -> None:
        """The request's KV is allocated: it waits in the transfer queue for the prefill's."""
        self.transfer.add(req)

    def start_decoding(self, req: Req) -> None:
        """The KV arrived: the scheduler's next iteration takes the request (_take_arrived)."""
        self.arrived.append(req)
        self._wake.set()

    def _take_arrived(self) -> None:
        """process_decode_queue's pop_transferred, then the prebuilt batch: each request
        enters the waiting queue, its first token (the prefill's) goes out and it joins the
        running batch."""
        arrived, self.arrived = self.arrived, []
        now = self.clock.now()
        for req in arrived:
            if req.done:
                continue
            self.transfer.discard(req)
            req.admitted = now  # enters the decode waiting queue
            self._emit(req, req.text.next())
            if not req.done:
                self.running.append(req)

    # ----- what differs from the unified server --------------------------------------
    def disagg_queues(self) -> DisaggQueues:
        return DisaggQueues(
            prealloc=len(self.prealloc),
            transfer=len(self.transfer),
            retracted=len(self.retracted),
            deferred_release=len(self.deferred),
        )

    # ----- deferred KV release (disaggregation/decode.py DecodeTransferQueue) ---------
    def defer_release(self, req: Req) -> int:
        """_defer_release: a request whose transfer failed keeps its KV slots (a prefill
        rank may still be writing into them) until the prefill acks the abort or
        SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT passes. On by default
        with the backends whose KVManager sets supports_deferred_decode_kv_release
        (mooncake, nixl, mori); the held slots, 0 when the release is not deferred."""
        backend = self.cfg.args.disaggregation_transfer_backend
        if not self.cfg.knobs.deferred_kv_release or backend not in DEFERRING_BACKENDS:
            return 0
        held, req.reserved = req.reserved, 0
        self.deferred.append(req)
        self._update_gauges()
        return held

    def release_deferred(self, req: Req, held: int, seconds: float, outcome: str) -> None:
        """resolve_deferred_releases -> _do_release: the slots go back to the pool and the
        resolution is observed (observe_decode_deferred_kv_release, every rank)."""
        self.deferred.remove(req)
        self.pool.release(held)
        self._prealloc_changed.set()
        m = self.metrics
        m.rank_observe(m.decode_deferred_kv_release_seconds, seconds)
        m.rank_inc(m.decode_deferred_kv_release, outcome=outcome)
        self._update_gauges()

    def load_queues(self) -> LoadQueues:
        # Transferring requests already hold their decode-side KV slots (in tokens_in_use).
        return LoadQueues(
            [*self.waiting, *self.prealloc, *self.transfer, *self.retracted],
            [*self.prealloc, *self.retracted],
            sum(r.prompt_tokens for r in (*self.prealloc, *self.transfer)),
        )

    def _occupied(self) -> int:
        return len(self.running) + len(self.transfer)

    def _held(self) -> list[Req]:
        return [*self.transfer, *self.deferred]

    def _leave_queues(self, req: Req) -> None:
        super()._leave_queues(req)
        self.transfer.discard(req)
        if req in self.retracted:
            self.retracted.remove(req)
        if req in self.arrived:
            self.arrived.remove(req)
        if req in self.held_for_rebootstrap:
            self.held_for_rebootstrap.remove(req)
        # Space or a running slot may free up once its KV is released; a cancelled waiter
        # must leave too (the waiters run after _finish).
        self._prealloc_changed.set()

    def _on_forward_entry(self, req: Req, now: float) -> None:
        # set_forward_entry_time: one queue-time sample per request, at its first forward
        if req.log_metrics:
            self.metrics.rank_observe(self.metrics.queue_time, now - (req.admitted or now))

    def _pending_prealloc_usage(self) -> float:
        return sum(r.reserved for r in self.transfer) / self.pool.size

    def _decode_stats(self, stats: DecodeStats) -> DecodeStats:
        host_receive = self.cfg.args.disaggregation_decode_host_receive_threshold < 1
        return dataclasses.replace(
            stats,
            preallocated_usage=self._pending_prealloc_usage(),
            prealloc_req=len(self.prealloc),
            transfer_req=len(self.transfer),
            retracted_req=len(self.retracted),
            # no host pool here: nothing is ever received into it
            host_receive_req=0 if host_receive else None,
        )

    # ----- retraction ----------------------------------------------------------------
    def _retract_for_pause(self) -> None:
        """scheduler.pause_generation retract on a decode: the running requests free their
        KV and are held (prealloc_queue.hold_rebootstrap), in no queue a gauge counts.
        SGLang holds the transferred requests not taken yet too; the sim leaves them in the
        transfer queue (they hold no running slot and no decode happens while paused)."""
        held = [r for r in self.running if not r.done]
        for req in held:
            self.pool.release(req.reserved)
            req.reserved = 0
        self.running = []
        self.held_for_rebootstrap += held

    def continue_generation(self) -> None:
        """enqueue_held_rebootstrap: the held requests wait for KV again. SGLang transfers
        their KV anew from the prefill; the sim resumes them as retracted requests (their
        output so far kept), when the pool has room."""
        self.retracted += self.held_for_rebootstrap
        self.held_for_rebootstrap = []
        super().continue_generation()

    def _before_decode(self) -> None:
        """process_decode_queue: resume retracted requests; while some still wait, leave the
        transferred ones where they are."""
        self._resume_retracted()
        if not self.retracted:
            self._take_arrived()

    def _resume_retracted(self) -> None:
        """resume_retracted_reqs: in queue order, while the request's KV plus headroom fits;
        its KV comes back from the host backup, so it decodes on from where it stopped."""
        reserve = self.cfg.args.num_reserved_decode_tokens
        while self.retracted:
            req = self.retracted[0]
            kv = req.prompt_tokens + req.generated
            if self._decode_budget(count_retracted=False) < kv + reserve:
                return
            self.retracted.pop(0)
            self.pool.try_reserve(kv)
            req.reserved = kv
            self.running.append(req)

    def _slots_needed(self, req: Req, step: int) -> int:
        """KV slots the request must gain to run a step of up to `step` tokens (the KV of
        the newest token is written by the step after it)."""
        tokens = min(step, req.max_new_tokens - req.generated)
        return max(req.prompt_tokens + req.generated + tokens - 1 - req.reserved, 0)

    def _allocate_step(self) -> None:
        """update_running_batch: retract when the next step does not fit (check_decode_mem),
        else take the step's slots."""
        step = math.ceil(self.cfg.spec_accept_len)
        free = self.pool.size - self.pool.used
        if sum(self._slots_needed(r, step) for r in self.running) > free:
            self._retract(step)
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO
            )
        for req in self.running:
            need = self._slots_needed(req, step)
            self.pool.try_reserve(need)
            req.reserved += need

    def _retract(self, step: int) -> None:
        """retract_decode: keep the requests with the most output tokens (then the shortest
        prompts), back the others' KV up to host and requeue them; the last one left that
        still does not fit is aborted."""
        keep = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        freed_from = self.pool.used
        retracted: list[Req] = []

        def fits() -> bool:
            return sum(self._slots_needed(r, step) for r in keep) <= self.pool.size - self.pool.used

        while len(keep) > 1 and (not retracted or not fits()):
            req = keep.pop()
            self.pool.release(req.reserved)
            req.reserved = 0
            retracted.append(req)
        self.running = keep
        if not fits():
            last = keep[0]
            self.abort(
                last,
                "Out of memory even after retracting all other requests in the decode batch. "
                "Aborting the last request.",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
            self.running = []
        self.retracted.extend(retracted)
        self.last_retracted = len(retracted)
        if retracted:
            m = self.metrics
            m.rank_inc(m.num_retracted_requests, len(retracted))
            m.rank_inc(m.num_retracted_input_tokens, sum(r.prompt_tokens for r in retracted))
            m.rank_inc(m.num_retracted_output_tokens, sum(r.generated for r in retracted))
        old_ratio = self.new_token_ratio
        self.new_token_ratio = min(
            1.0,
            (sum(r.generated for r in keep) + RETRACT_DECODE_STEPS * len(keep))
            / (sum(r.max_new_tokens for r in keep) + 1),
        )
        self.log.warning(
            "KV cache pool is full. Retract requests. #retracted_reqs: %d, "
            "#new_tokens_gained: %d, #new_token_ratio: %.4f -> %.4f",
            len(retracted),
            freed_from - self.pool.used,
            old_ratio,
            self.new_token_ratio,
        )
