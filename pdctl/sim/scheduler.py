"""The simulated scheduler: one asyncio task that runs prefill batches and decode steps.

This is the unified (non-PD) server and what the PD servers share, as SGLang's `Scheduler`
is; a PD server's queues and the steps that differ live in its mode's subclass
(scheduler_prefill.py, scheduler_decode.py), as SGLang's disaggregation mixins hold them.
Queues here: `waiting` (needs prefill) and `running` (decoding). A unified server reserves
prompt + output budget in the KV pool when it admits a request, so it never runs out
mid-decode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus

from .args import SimConfig
from .logs import DecodeStats, PrefillStats, decode_line, prefill_line
from .metrics import SimMetrics, Startup
from .model import Clock, GPUTimeline, KVPool, StepModel
from .req import Abort, Finish, Req, Token
from .sampling import EOS_TOKEN_ID, Sample


@dataclass(frozen=True)
class DisaggQueues:
    """Lengths of the disaggregation queues: 0 on a server whose mode has none of them."""

    bootstrap: int = 0
    inflight: int = 0
    prealloc: int = 0
    transfer: int = 0
    retracted: int = 0
    deferred_release: int = 0

    def __bool__(self) -> bool:
        return any(dataclasses.astuple(self))


@dataclass(frozen=True)
class LoadQueues:
    """What LoadInquirer.get_loads counts: waiting requests, those whose KV is not
    allocated yet, and the prompt tokens still to arrive over a transfer."""

    waiting: list[Req]
    pending: list[Req]
    awaiting_kv_tokens: int = 0


class Scheduler:
    def __init__(self, cfg: SimConfig, metrics: SimMetrics, log: logging.Logger) -> None:
        k = cfg.knobs
        self.cfg = cfg
        self.metrics = metrics
        metrics.set_tp_size(cfg.args.tp_size)
        self.log = log
        self.clock = Clock(k.time_scale)
        self.gpu = GPUTimeline(self.clock)
        self.steps = StepModel(k.step_a_ms, k.step_b_ms, k.eager_penalty, cfg.decode_buckets)
        self.pool = KVPool(cfg.kv_pool_tokens)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        # metrics_reporter.num_retracted_reqs: set to the count of each retraction (not
        # added up), published and reset to 0 at the next stats line.
        self.last_retracted = 0
        self._wake = asyncio.Event()
        self.forward_ct_decode = 0
        self._tokens_since_log = 0
        self._last_decode_log = self.clock.now()
        # SGLang's log_prefill_stats: a line carries the previous batch's new tokens over
        # the time between the two batches' scheduling (what a journal's prefill law reads).
        self._last_prefill_start = self.clock.now()
        self._last_prefill_tokens = 0
        self.last_gen_throughput = 0.0
        self.last_cuda_graph = True
        # metrics_reporter's device-timer window (SGLANG_ENABLE_METRICS_DEVICE_TIMER): GPU
        # time over wall time since the window opened; NaN without the timer and at idle.
        self.fwd_occupancy = math.nan
        self._occupancy_window: tuple[float, float] | None = None
        # Speculative decoding: request-steps and the tokens they gained since the last line.
        self._spec_rng = random.Random(cfg.knobs.seed)
        self._spec_forward_ct = 0
        # /pause_generation in_place or retract (scheduler._engine_paused): no batch runs
        # until /continue_generation sets `_resumed`.
        self.paused = False
        self._resumed = asyncio.Event()
        # Held while a batch runs: SGLang's scheduler takes a pause request between batches
        # (process_input_requests), never in the middle of one.
        self._stepping = asyncio.Lock()
        self._resumed.set()

    # ----- what a mode's scheduler changes -------------------------------------------
    def disagg_queues(self) -> DisaggQueues:
        return DisaggQueues()

    def load_queues(self) -> LoadQueues:
        return LoadQueues(list(self.waiting), list(self.waiting))

    def _occupied(self) -> int:
        """Requests holding a running slot (max_running_requests bounds them)."""
        return len(self.running)

    def _held(self) -> list[Req]:
        """Requests whose prompt's KV is written but not decoding (in a transfer)."""
        return []

    def _kv_need(self, req: Req) -> int:
        """KV slots a prefill admission reserves: the prompt and the whole output."""
        return req.prompt_tokens + req.max_new_tokens

    def _admitted(self, req: Req) -> None:
        self.running.append(req)

    def _leave_queues(self, req: Req) -> None:
        """A finished request leaves every queue it is in."""
        if req in self.waiting:
            self.waiting.remove(req)

    def _process_prefill_result(self, batch: list[Req], now: float) -> list[Req]:
        """process_batch_result_prefill: the first token of each prefilled request; the
        requests that go back to the bootstrap queue (none here)."""
        for req in batch:
            req.prefill_attempts += 1
            self._observe_prefill_forward(req, now)
            self._emit(req, req.text.next())
        return []

    def _prefill_stats(self, stats: PrefillStats, to_bootstrap: list[Req]) -> PrefillStats:
        return stats

    def _before_decode(self) -> None:
        """Before the decode step is chosen (a decode server resumes retracted requests)."""

    def _allocate_step(self) -> None:
        """Take the KV slots of the next decode step: a unified server's admission
        reservations already cover them."""

    def _on_forward_entry(self, req: Req, now: float) -> None:
        """A request's first decode forward (a decode server records its queue time)."""

    def _decode_stats(self, stats: DecodeStats) -> DecodeStats:
        return stats

    def _utilization(self) -> float:
        """_calculate_utilization: max_running_requests_under_SLO has no setter in 0.5.23,
        so the gauge stays 0 (a prefill server reports -1)."""
        return 0.0

    def _pending_prealloc_usage(self) -> float:
        return 0.0

    # ----- admission -----------------------------------------------------------------
    def submit_prefill(self, req: Req) -> None:
        """Queue a request for prefill (unified and prefill servers)."""
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: Req, message: str, status: HTTPStatus) -> None:
        if req.done:
            return
        req.out.put_nowait(Abort(message, status))
        self._finish(req)
        if req.log_metrics:
            self.metrics.tok_inc(self.metrics.num_aborted_requests)

    def abort_graceful(self, req: Req) -> None:
        """abort_request(abort_all=True) as the client sees it: no status, so a normal answer
        whose finish reason is abort. A request not admitted yet gets _handle_abort_req's
        "Abort in waiting queue"; an admitted one FINISH_ABORT().to_json() (abort method 3)."""
        if req.done:
            return
        if req.admitted is None:
            fields: tuple[tuple[str, str | None], ...] = (("message", "Abort in waiting queue"),)
        else:
            fields = (("message", "Aborted"), ("status_code", None), ("err_type", None))
        req.out.put_nowait(Finish("abort", abort=fields))
        self._finish(req)

    async def pause_generation(self, mode: str) -> None:
        """scheduler.pause_generation (in_place, retract), once the batch running has ended
        (its result processed, its stats line logged): the event loop stops running
        batches; retract also puts the running requests back in the waiting queue with
        their KV freed (they prefill again on resume), and zeroes gen_throughput and
        publishes the gauges at once (the paused loop never reaches on_idle)."""
        async with self._stepping:
            self._pause(mode)

    def _pause(self, mode: str) -> None:
        self.paused = True
        self._resumed.clear()
        if mode != "retract":
            return  # in_place: every queue and gauge stays as it is
        self._retract_for_pause()
        self.last_gen_throughput = 0.0
        self._update_gauges()

    def _retract_for_pause(self) -> None:
        """retract_all over the running batch, back to the head of the waiting queue (a
        decode holds them for a rebootstrap from its prefill instead, which the sim does not
        model: its running requests keep their KV and wait in place)."""
        live = [r for r in self.running if not r.done]
        for req in reversed(live):
            self.running.remove(req)
            self.pool.release(req.reserved)
            req.reserved = 0
            req.admitted = None
            self.waiting.appendleft(req)

    def continue_generation(self) -> None:
        """scheduler.continue_generation: the event loop runs batches again."""
        self.paused = False
        self._resumed.set()
        self._wake.set()

    def cancel(self, req: Req) -> None:
        """Client went away: drop the request wherever it is."""
        if not req.done:
            self._finish(req)

    def _can_admit(self, tokens: int) -> bool:
        busy = self._occupied()
        return busy < self.cfg.max_running_requests and self.pool.used + tokens <= self.pool.size

    def _finish(self, req: Req) -> None:
        req.done = True
        req.prefilled.set()  # a prefill leg waiting on it must see the end
        self._leave_queues(req)
        if req.reserved:
            self.pool.release(req.reserved)
            req.reserved = 0

    # ----- outputs -------------------------------------------------------------------
    def _emit(self, req: Req, sample: Sample, step_tokens: int = 1) -> None:
        """One token. A speculative step gives a request `step_tokens` at the same instant:
        the first of them observes interval / n, n times, as SGLang's tokenizer manager does
        for a chunk of n tokens; the others observe nothing."""
        now = self.clock.now()
        req.generated += 1
        if req.first_token_at is None:
            req.first_token_at = now
        elif (
            req.log_metrics
            and req.last_token_at is not None
            and (now > req.last_token_at or step_tokens == 1)
        ):
            for _ in range(step_tokens):
                self.metrics.tok_observe(
                    self.metrics.inter_token_latency, (now - req.last_token_at) / step_tokens
                )
        req.last_token_at = now
        req.out.put_nowait(Token(sample.visible, sample))
        if sample.matched is not None:
            req.out.put_nowait(Finish("stop", sample.matched))
            self._finish(req)
        elif req.generated >= req.max_new_tokens:
            eos = EOS_TOKEN_ID if req.finish_reason == "stop" else None
            req.out.put_nowait(Finish(req.finish_reason, eos, req.text.flush()))
            self._finish(req)

    # ----- the loop ------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            if self.paused:
                await self._paused()
                continue
            self.running = [r for r in self.running if not r.done]
            batch = self._take_prefill_batch()
            if batch:
                async with self._stepping:
                    await self._prefill(batch)
                continue
            self._before_decode()
            if self.running:
                async with self._stepping:
                    await self._decode_step()
            else:
                self._wake.clear()
                self.gpu.idle()
                self._reset_occupancy_window()
                idle_from = self.clock.now()
                await self._wake.wait()
                self.metrics.rank_inc(
                    self.metrics.scheduler_idle_seconds, self.clock.now() - idle_from
                )

    async def _paused(self) -> None:
        """_record_scheduler_state_for_paused_engine: a pause holding requests counts as
        busy, an empty one as idle."""
        idle = not self.busy
        since = self.clock.now()
        self.gpu.idle()
        await self._resumed.wait()
        if idle:
            self.metrics.rank_inc(self.metrics.scheduler_idle_seconds, self.clock.now() - since)

    def _take_prefill_batch(self) -> list[Req]:
        batch: list[Req] = []
        budget = self.cfg.chunked_prefill_size
        while self.waiting:
            req = self.waiting[0]
            if req.done:
                self.waiting.popleft()
                continue
            need = self._kv_need(req)
            if batch and req.prompt_tokens > budget:
                break
            if not self._can_admit(need):
                break
            self.waiting.popleft()
            self.pool.try_reserve(need)
            req.reserved = need
            req.admitted = self.clock.now()
            budget -= req.prompt_tokens
            batch.append(req)
            self._admitted(req)
        return batch

    async def _prefill(self, batch: list[Req]) -> None:
        k = self.cfg.knobs
        new_tokens = sum(r.prompt_tokens for r in batch)
        start = self.clock.now()
        gap = max(start - self._last_prefill_start, 1e-9)
        input_throughput = self._last_prefill_tokens / gap
        self._last_prefill_start, self._last_prefill_tokens = start, new_tokens
        await self.gpu.forward((k.prefill_base_ms + k.prefill_ms_per_token * new_tokens) / 1000)
        now = self.clock.now()
        to_bootstrap = self._process_prefill_result([r for r in batch if not r.done], now)
        stats = PrefillStats(
            new_seq=len(batch),
            new_token=new_tokens,
            cached_token=0,
            token_usage=self.token_usage,
            running_req=len(self.running),
            queue_req=len(self.waiting),
            pending_token=sum(r.prompt_tokens for r in self.waiting),
            cuda_graph=False,
            input_throughput=input_throughput,
        )
        self.log.info(prefill_line(self._prefill_stats(stats, to_bootstrap)))
        # Their bootstrap is done: the bootstrap queue hands them back at its next poll.
        self.waiting.extend(to_bootstrap)
        m = self.metrics
        m.sched_inc(m.cuda_graph_passes, mode="prefill_none")
        m.sched_inc(m.realtime_tokens, new_tokens, mode="prefill_compute")
        self._update_gauges()

    def _observe_prefill_forward(self, req: Req, now: float) -> None:
        """set_forward_entry_time at the prefill forward: queue time and the forward stage."""
        if not req.log_metrics:
            return
        m = self.metrics
        m.rank_observe(m.queue_time, (req.admitted or now) - req.created)
        m.rank_observe(
            m.per_stage_req_latency, now - (req.admitted or now), stage="prefill_forward"
        )

    async def _decode_step(self) -> None:
        self._allocate_step()
        if not self.running:
            return
        n = len(self.running)
        step_ms, graph = self.steps.decode_step_ms(n)
        if not graph and self.cfg.knobs.eager_oom:
            self._crash_oom(n)
        ended = await self.gpu.forward(step_ms / 1000)
        now = self.clock.now()
        tokens = 0
        for req in self.running:
            if not req.forwarded:
                self._on_forward_entry(req, now)
            req.forwarded = True
            if not req.done:
                k = min(self._step_tokens(), req.max_new_tokens - req.generated)
                for _ in range(k):  # a stop string may end the request inside the step
                    if not req.done:
                        self._emit(req, req.text.next(), k)
                        tokens += 1
        self.last_cuda_graph = graph
        self.forward_ct_decode += 1
        self._tokens_since_log += tokens
        self._spec_forward_ct += n
        m = self.metrics
        # batch_result_processor: decode passes are counted by every rank
        m.rank_inc(m.cuda_graph_passes, mode="decode_cuda_graph" if graph else "decode_none")
        m.sched_inc(m.realtime_tokens, tokens, mode="decode")
        if self.forward_ct_decode % self.cfg.args.decode_log_interval == 0:
            self._log_decode(n, graph, ended)

    def _step_tokens(self) -> int:
        """Tokens one request gains this step: 1, or with speculative decoding the accept
        length's integer part plus one more with the probability of its fraction."""
        accept = self.cfg.spec_accept_len
        whole = math.floor(accept)
        if whole == accept:
            return whole
        return whole + (self._spec_rng.random() < accept - whole)

    def _spec_stats(self, tokens: int) -> tuple[float | None, float | None]:
        """(accept len, accept rate) over the steps since the last line, as
        metrics_reporter computes them: tokens / request-steps, correct drafts / drafts."""
        draft = self.cfg.spec_draft_tokens
        forward_ct, self._spec_forward_ct = self._spec_forward_ct, 0
        if draft is None or not forward_ct:
            return None, None
        drafted = forward_ct * (draft - 1)
        return tokens / forward_ct, (tokens - forward_ct) / drafted if drafted else 0.0

    def _log_decode(self, n: int, graph: bool, now: float) -> None:
        """`now`: when the step's forward ended. SGLang takes the line's time once the step's
        results are in, which on the modelled host is when the forward ends, not when this
        process wakes up on a loaded test machine (a late wake-up would move tokens between
        lines' windows and skew both lines' throughput)."""
        tokens = self._tokens_since_log
        self.last_gen_throughput = tokens / max(now - self._last_decode_log, 1e-9)
        self._tokens_since_log = 0
        self._last_decode_log = now
        accept_len, accept_rate = self._spec_stats(tokens)
        num_token = self.tokens_in_use()
        stats = DecodeStats(
            running_req=n,
            num_token=num_token,
            token_usage=num_token / self.pool.size,
            cuda_graph=graph,
            gen_throughput=self.last_gen_throughput,
            queue_req=len(self.waiting),
            accept_len=accept_len,
            accept_rate=accept_rate,
        )
        self.log.info(decode_line(self._decode_stats(stats)))
        self._measure_occupancy(now)
        self._update_gauges()

    def _measure_occupancy(self, now: float) -> None:
        """metrics_reporter._update_device_timer_window at a decode stats line: the window
        opens at the first line after idle (the gauge keeps its value) and each later line
        reports GPU time over wall time since then, capped at 100 %."""
        if not self.cfg.knobs.metrics_device_timer:
            return
        if self._occupancy_window is None:
            self._occupancy_window = (now, self.gpu.busy_s)
            return
        since, busy = self._occupancy_window
        if now > since:
            self.fwd_occupancy = min((self.gpu.busy_s - busy) / (now - since) * 100, 100.0)

    def _reset_occupancy_window(self) -> None:
        """_reset_device_timer_window at idle: the gauge turns NaN, published at once if it
        held a value (_maybe_log_idle_metrics' is_fwd_occupancy_stale)."""
        self._occupancy_window = None
        if not math.isnan(self.fwd_occupancy):
            self.fwd_occupancy = math.nan
            self._update_gauges()

    def _crash_oom(self, n: int) -> None:
        # The seed's crash: 33+ requests past a 32-wide graph wanted 3.94 GiB of temporaries.
        self.log.error(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB. "
            "GPU 0 has a total capacity of %.2f GiB (eager decode batch of %d requests, "
            "largest CUDA graph %d)",
            3.94 * n / 33,
            self.cfg.knobs.gpu_mem_gib,
            n,
            self.cfg.decode_buckets[-1],
        )
        logging.shutdown()
        os._exit(1)

    def _update_gauges(self) -> None:
        m = self.metrics
        running = [r for r in self.running if not r.done]
        m.sched_gauge(m.num_running_reqs, len(running))
        m.sched_gauge(m.num_queue_reqs, len(self.waiting))
        m.sched_gauge(m.gen_throughput, self.last_gen_throughput)
        m.sched_gauge(m.cache_hit_rate, 0.0)
        used = self.tokens_in_use()
        m.sched_gauge(m.token_usage, round(used / self.pool.size, 2))
        m.sched_gauge(m.num_used_tokens, used)
        m.sched_gauge(m.kv_used_tokens, used)
        m.sched_gauge(m.kv_available_tokens, self.pool.size - used)
        m.sched_gauge(m.is_cuda_graph, 1.0 if self.last_cuda_graph else 0.0)
        m.sched_gauge(m.utilization, self._utilization())
        m.sched_gauge(m.fwd_occupancy, self.fwd_occupancy)
        # log_stats writes every PD gauge in every mode (0 outside its role).
        q = self.disagg_queues()
        m.sched_gauge(m.num_prefill_bootstrap_queue_reqs, q.bootstrap)
        m.sched_gauge(m.num_prefill_inflight_queue_reqs, q.inflight)
        m.sched_gauge(m.num_decode_prealloc_queue_reqs, q.prealloc)
        m.sched_gauge(m.num_decode_transfer_queue_reqs, q.transfer)
        m.sched_gauge(m.num_decode_host_receive_queue_reqs, 0)  # no host-staged receive
        m.sched_gauge(m.num_decode_deferred_kv_release_reqs, q.deferred_release)
        m.sched_gauge(m.pending_prealloc_token_usage, self._pending_prealloc_usage())
        # The last retraction's count since the previous stats line, 0 if none; between
        # stats lines (and at idle, where SGLang republishes its last stats) it holds.
        m.sched_gauge(m.num_retracted_reqs, self.last_retracted, **m.pid)
        if m.enabled:  # without metrics nothing publishes the count, so /v1/loads keeps it
            self.last_retracted = 0
        m.sched_gauge(m.num_paused_reqs, 0, **m.pid)

    def publish_static_metrics(self, startup: Startup) -> None:
        self.metrics.set_static(startup)
        self._update_gauges()

    def tokens_in_use(self) -> int:
        """KV tokens actually written (reservations cover the output budget in advance)."""
        live = [r for r in self.running if not r.done]
        held = self._held()
        return sum(r.prompt_tokens + r.generated for r in live) + sum(r.prompt_tokens for r in held)

    @property
    def token_usage(self) -> float:
        return self.tokens_in_use() / self.pool.size

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.disagg_queues())
