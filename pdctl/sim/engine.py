"""The simulated scheduler: one asyncio task that runs prefill batches and decode steps.

Queues mirror SGLang's: `waiting` (needs prefill; unified and prefill servers), on a decode
server `prealloc` (waiting for KV pool space), `transfer` (waiting for the prefill's KV) and
`retracted`, and `running` (decoding). A unified server reserves prompt + output budget in the
KV pool when it admits a request (a prefill server the prompt only, freed after the transfer),
so it never runs out mid-decode.

A decode server allocates as SGLang's DecodePreallocQueue does: the prompt at admission, then
one slot per token as it decodes. Admission keeps `--num-reserved-decode-tokens` of headroom
per active request and counts the running requests' KV as retractable, so a decode can admit
more than its pool holds at full length. When the next step does not fit, it retracts as
`Scheduler.update_running_batch` / `ScheduleBatch.retract_decode` do: the requests with the
fewest output tokens (then the longest prompts) leave the batch until the rest fits, their KV
backed up to host (`retracted` queue, `#retracted-req`), and they resume with their output so
far when space returns; the client only sees a pause.

A prefill server honours SGLang's test hook SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB as
`disaggregation/prefill.py` does (should_force_retry, optimistic_release_and_requeue): the first
prefill of a request whose rid hashes below the probability is thrown away and the request
queued again. It yields (logged, counted in `num_prefill_retries_total` by every rank, back at
the head of the queue) while `--optimistic-prefill-attempts` has one left, else falls back to
the bootstrap queue; either way it is prefilled once more, and never forced again.

Outputs go to each request's queue as `Token`, `Finish` or `Abort` events.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus

from .args import GIB, SimConfig
from .logs import DecodeStats, PrefillStats, decode_line, prefill_line
from .metrics import SimMetrics
from .model import Clock, KVPool, StepModel
from .sampling import EOS_TOKEN_ID, Sample, Sampler

# sglang/srt/environ.py defaults: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION,
# SGLANG_RETRACT_DECODE_STEPS, SGLANG_INIT_NEW_TOKEN_RATIO (x schedule_conservativeness 1.0),
# SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR and SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600


@dataclass(frozen=True)
class Token:
    text: str  # the output text it releases (stop strings and their possible starts held back)
    sample: Sample | None = None


@dataclass(frozen=True)
class Finish:
    reason: str  # "length" | "stop"
    matched: int | str | None = None  # the stop string or token id, as meta_info reports it
    tail: str = ""  # text held back for a stop string that never came


@dataclass(frozen=True)
class Abort:
    message: str
    status: HTTPStatus


Event = Token | Finish | Abort


@dataclass(eq=False)
class Req:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    finish_reason: str  # reported when max_new_tokens is reached
    stream: bool
    text: Sampler
    created: float
    room: int | None = None
    log_metrics: bool = True
    # Health checks carry a fake bootstrap host: no peer, no transfer.
    fake_bootstrap: bool = False
    out: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    generated: int = 0
    reserved: int = 0
    done: bool = False
    admitted: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefilled: asyncio.Event = field(default_factory=asyncio.Event)
    forwarded: bool = False
    prefill_attempts: int = 0  # Req.prefill_attempt_count


def forces_prefill_retry(rid: str, prob: float) -> bool:
    """prefill.should_force_retry's draw: the first 8 bytes of sha256(rid) below prob * 2**64,
    so the same rids retry on every run."""
    digest = hashlib.sha256(rid.encode()).digest()
    return prob > 0 and int.from_bytes(digest[:8], "big") < prob * 2**64


class Engine:
    def __init__(self, cfg: SimConfig, metrics: SimMetrics | None, log: logging.Logger) -> None:
        k = cfg.knobs
        self.cfg = cfg
        self.metrics = metrics
        if metrics:
            metrics.set_tp_size(cfg.args.tp_size)
        self.log = log
        self.clock = Clock(k.time_scale)
        self.steps = StepModel(k.step_a_ms, k.step_b_ms, k.eager_penalty, cfg.decode_buckets)
        self.pool = KVPool(cfg.kv_pool_tokens)
        self.waiting: deque[Req] = deque()
        self.prealloc: deque[Req] = deque()
        self.transfer: set[Req] = set()
        self.running: list[Req] = []
        # Decode server: retracted under KV pressure, KV backed up to host, waiting to resume.
        self.retracted: list[Req] = []
        # metrics_reporter.num_retracted_reqs: set to the count of each retraction (not
        # added up), published and reset to 0 at the next stats line.
        self.last_retracted = 0
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        # Prefill server: requests waiting for their decode (bootstrap) and in KV transfer.
        self.bootstrap_queue: set[Req] = set()
        self.inflight: set[Req] = set()
        self._wake = asyncio.Event()
        self._prealloc_changed = asyncio.Event()
        self.forward_ct_decode = 0
        self._tokens_since_log = 0
        self._last_decode_log = self.clock.now()
        # SGLang's log_prefill_stats: a line carries the previous batch's new tokens over
        # the time between the two batches' scheduling (what a journal's prefill law reads).
        self._last_prefill_start = self.clock.now()
        self._last_prefill_tokens = 0
        self.last_gen_throughput = 0.0
        self.last_cuda_graph = True
        # Speculative decoding: request-steps and the tokens they gained since the last line.
        self._spec_rng = random.Random(cfg.knobs.seed)
        self._spec_forward_ct = 0

    # ----- admission -----------------------------------------------------------------
    def submit_prefill(self, req: Req) -> None:
        """Queue a request for prefill (unified and prefill servers)."""
        self.waiting.append(req)
        self._wake.set()

    async def preallocate(self, req: Req) -> None:
        """Decode server: wait in the prealloc queue until the request's prompt fits with the
        decode headroom, then allocate the prompt's KV."""
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
        active = len(self.running) + len(self.transfer)
        budget = self.pool.size - self.pool.used - reserve * active
        if count_retracted:
            budget -= sum(r.prompt_tokens + r.generated + reserve for r in self.retracted)
        return budget

    def _decode_admits(self, req: Req) -> bool:
        """_required_admission_tokens: the prompt plus headroom, or the whole (clipped) output
        less what retracting the running batch would free. The headroom is capped at the
        request's own output so that a small pool (PDSIM_KV_POOL_TOKENS) still serves."""
        if len(self.running) + len(self.transfer) >= self.cfg.max_running_requests:
            return False
        retractable = sum(r.prompt_tokens + r.generated for r in self.running if not r.done)
        headroom = min(self.cfg.args.num_reserved_decode_tokens, req.max_new_tokens)
        need = max(
            req.prompt_tokens + headroom,
            req.prompt_tokens + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) - retractable,
        )
        return self._decode_budget(count_retracted=True) >= need

    def start_decoding(self, req: Req) -> None:
        """Decode server: the KV arrived; the prefill's first token goes out now."""
        self.transfer.discard(req)
        req.admitted = self.clock.now()  # enters the decode waiting queue
        self._emit(req, req.text.next())
        if not req.done:
            self.running.append(req)
            self._wake.set()

    def abort(self, req: Req, message: str, status: HTTPStatus) -> None:
        if req.done:
            return
        req.out.put_nowait(Abort(message, status))
        self._finish(req)
        if self.metrics and req.log_metrics:
            self.metrics.tok_inc(self.metrics.num_aborted_requests)

    def cancel(self, req: Req) -> None:
        """Client went away: drop the request wherever it is."""
        if not req.done:
            self._finish(req)

    def _can_admit(self, tokens: int) -> bool:
        busy = len(self.running) + len(self.transfer) + len(self.inflight)
        return busy < self.cfg.max_running_requests and self.pool.used + tokens <= self.pool.size

    def _finish(self, req: Req) -> None:
        req.done = True
        req.prefilled.set()  # a prefill leg waiting on it must see the end
        if req in self.waiting:
            self.waiting.remove(req)
        self.transfer.discard(req)
        self.inflight.discard(req)
        self.bootstrap_queue.discard(req)
        if req in self.retracted:
            self.retracted.remove(req)
        if req.reserved:
            self.pool.release(req.reserved)
            req.reserved = 0
        # Space or a running slot may have freed up; a cancelled waiter must leave too.
        self._prealloc_changed.set()

    def complete_prefill(self, req: Req) -> None:
        """Prefill server: the KV reached the decode; answer with the first token."""
        if not req.done:
            req.max_new_tokens = 1
            self._emit(req, req.text.next())

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
            self.metrics
            and req.log_metrics
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
            self.running = [r for r in self.running if not r.done]
            batch = self._take_prefill_batch()
            if batch:
                await self._prefill(batch)
                continue
            self._resume_retracted()
            if self.running:
                await self._decode_step()
            else:
                self._wake.clear()
                idle_from = self.clock.now()
                await self._wake.wait()
                if self.metrics:
                    self.metrics.rank_inc(
                        self.metrics.scheduler_idle_seconds, self.clock.now() - idle_from
                    )

    def _take_prefill_batch(self) -> list[Req]:
        batch: list[Req] = []
        budget = self.cfg.chunked_prefill_size
        prefill_only = self.cfg.mode == "prefill"
        while self.waiting:
            req = self.waiting[0]
            if req.done:
                self.waiting.popleft()
                continue
            need = req.prompt_tokens + (0 if prefill_only else req.max_new_tokens)
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
            if prefill_only:
                self.inflight.add(req)
            else:
                self.running.append(req)
        return batch

    async def _prefill(self, batch: list[Req]) -> None:
        k = self.cfg.knobs
        new_tokens = sum(r.prompt_tokens for r in batch)
        start = self.clock.now()
        gap = max(start - self._last_prefill_start, 1e-9)
        input_throughput = self._last_prefill_tokens / gap
        self._last_prefill_start, self._last_prefill_tokens = start, new_tokens
        await self.clock.sleep((k.prefill_base_ms + k.prefill_ms_per_token * new_tokens) / 1000)
        now = self.clock.now()
        prefill_server = self.cfg.mode == "prefill"
        back_to_bootstrap: list[Req] = []
        forced = 0
        for req in batch:
            if req.done:
                continue
            req.prefill_attempts += 1
            if (
                prefill_server
                and req.prefill_attempts == 1
                and forces_prefill_retry(req.rid, self.cfg.knobs.force_prefill_retry_prob)
            ):
                forced += 1
                if not self._requeue_optimistic(req):
                    back_to_bootstrap.append(req)
                continue
            if self.metrics and req.log_metrics:
                self.metrics.rank_observe(
                    self.metrics.queue_time, (req.admitted or now) - req.created
                )
                self.metrics.rank_observe(
                    self.metrics.per_stage_req_latency,
                    now - (req.admitted or now),
                    stage="prefill_forward",
                )
            if prefill_server and not req.fake_bootstrap:
                req.prefilled.set()
            else:
                self._emit(req, req.text.next())
        stats = PrefillStats(
            new_seq=len(batch),
            new_token=new_tokens,
            cached_token=0,
            token_usage=self.token_usage,
            running_req=0 if prefill_server else len(self.running),
            queue_req=len(self.waiting),
            pending_token=sum(r.prompt_tokens for r in self.waiting),
            cuda_graph=False,
            input_throughput=input_throughput,
            bootstrap_req=len(self.bootstrap_queue) + len(back_to_bootstrap)
            if prefill_server
            else None,
            inflight_req=len(self.inflight) if prefill_server else None,
            # requests whose bootstrap is still pending after the pass: the forced ones
            optimistic_req=forced if prefill_server else None,
        )
        self.log.info(prefill_line(stats))
        # Their bootstrap is done: the bootstrap queue hands them back at its next poll.
        self.waiting.extend(back_to_bootstrap)
        if self.metrics:
            m = self.metrics
            m.sched_inc(m.cuda_graph_passes, mode="prefill_none")
            m.sched_inc(m.realtime_tokens, new_tokens, mode="prefill_compute")
            self._update_gauges()

    def _requeue_optimistic(self, req: Req) -> bool:
        """optimistic_release_and_requeue: release the request's KV; with an attempt left it
        yields to the head of the queue (True), else it falls back to the bootstrap queue."""
        self.inflight.discard(req)
        self.pool.release(req.reserved)
        req.reserved = 0
        attempts = self.cfg.optimistic_prefill_attempts
        if (
            req.prefill_attempts >= attempts
            and self.cfg.args.disaggregation_decode_allocation_policy != "prefill_complete"
        ):
            self.log.info(
                "Req %s exhausted optimistic prefill attempts falling back to bootstrap queue",
                req.rid,
            )
            return False
        req.prefill_attempts += 1
        self.log.info(
            "Req %s optimistic prefill yielded (%d/%d attempts used)",
            req.rid,
            req.prefill_attempts,
            attempts,
        )
        if self.metrics:
            self.metrics.rank_inc(self.metrics.num_prefill_retries)
        self.waiting.appendleft(req)
        return True

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
        else take the step's slots. A unified server's reservations already cover it."""
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
        if self.metrics and retracted:
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

    async def _decode_step(self) -> None:
        self._allocate_step()
        if not self.running:
            return
        n = len(self.running)
        step_ms, graph = self.steps.decode_step_ms(n)
        if not graph and self.cfg.knobs.eager_oom:
            self._crash_oom(n)
        await self.clock.sleep(step_ms / 1000)
        now = self.clock.now()
        tokens = 0
        for req in self.running:
            if self.metrics and req.log_metrics and not req.forwarded and self.cfg.mode == "decode":
                # set_forward_entry_time: one queue-time sample per request, at its first forward
                self.metrics.rank_observe(self.metrics.queue_time, now - (req.admitted or now))
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
        if self.metrics:
            m = self.metrics
            # batch_result_processor: decode passes are counted by every rank
            m.rank_inc(m.cuda_graph_passes, mode="decode_cuda_graph" if graph else "decode_none")
            m.sched_inc(m.realtime_tokens, tokens, mode="decode")
        if self.forward_ct_decode % self.cfg.args.decode_log_interval == 0:
            self._log_decode(n, graph)

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

    def _log_decode(self, n: int, graph: bool) -> None:
        now = self.clock.now()
        tokens = self._tokens_since_log
        self.last_gen_throughput = tokens / max(now - self._last_decode_log, 1e-9)
        self._tokens_since_log = 0
        self._last_decode_log = now
        accept_len, accept_rate = self._spec_stats(tokens)
        decode_server = self.cfg.mode == "decode"
        host_receive = self.cfg.args.disaggregation_decode_host_receive_threshold < 1
        num_token = self.tokens_in_use()
        self.log.info(
            decode_line(
                DecodeStats(
                    running_req=n,
                    num_token=num_token,
                    token_usage=num_token / self.pool.size,
                    cuda_graph=graph,
                    gen_throughput=self.last_gen_throughput,
                    queue_req=len(self.waiting),
                    preallocated_usage=(
                        sum(r.reserved for r in self.transfer) / self.pool.size
                        if decode_server
                        else None
                    ),
                    prealloc_req=len(self.prealloc) if decode_server else None,
                    transfer_req=len(self.transfer) if decode_server else None,
                    retracted_req=len(self.retracted) if decode_server else None,
                    # no host pool here: nothing is ever received into it
                    host_receive_req=0 if decode_server and host_receive else None,
                    accept_len=accept_len,
                    accept_rate=accept_rate,
                )
            )
        )
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
        if not self.metrics:
            return
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
        # _calculate_utilization: -1 on prefill; elsewhere max_running_requests_under_SLO has
        # no setter in 0.5.23, so the gauge stays 0.
        m.sched_gauge(m.utilization, -1.0 if self.cfg.mode == "prefill" else 0.0)
        # log_stats writes every PD gauge in every mode (0 outside its role).
        prefill, decode = self.cfg.mode == "prefill", self.cfg.mode == "decode"
        m.sched_gauge(
            m.num_prefill_bootstrap_queue_reqs, len(self.bootstrap_queue) if prefill else 0
        )
        m.sched_gauge(m.num_prefill_inflight_queue_reqs, len(self.inflight) if prefill else 0)
        m.sched_gauge(m.num_decode_prealloc_queue_reqs, len(self.prealloc) if decode else 0)
        m.sched_gauge(m.num_decode_transfer_queue_reqs, len(self.transfer) if decode else 0)
        m.sched_gauge(m.num_decode_host_receive_queue_reqs, 0)  # no host-staged receive
        m.sched_gauge(m.num_decode_deferred_kv_release_reqs, 0)
        m.sched_gauge(
            m.pending_prealloc_token_usage,
            sum(r.reserved for r in self.transfer) / self.pool.size if decode else 0.0,
        )
        # The last retraction's count since the previous stats line, 0 if none; between
        # stats lines (and at idle, where SGLang republishes its last stats) it holds.
        m.sched_gauge(m.num_retracted_reqs, self.last_retracted, **m.pid)
        self.last_retracted = 0
        m.sched_gauge(m.num_paused_reqs, 0, **m.pid)

    def publish_static_metrics(self) -> None:
        if not self.metrics:
            return
        k = self.cfg.knobs
        self.metrics.set_static(
            self.pool.size,
            self.cfg.page_size,
            self.cfg.context_length,
            k.weights_gib * GIB / 1e9,
            self.pool.size * k.kv_bytes_per_token / 1e9,
        )
        self._update_gauges()

    def tokens_in_use(self) -> int:
        """KV tokens actually written (reservations cover the output budget in advance)."""
        live = [r for r in self.running if not r.done]
        held = [*self.inflight, *self.transfer]
        return sum(r.prompt_tokens + r.generated for r in live) + sum(r.prompt_tokens for r in held)

    @property
    def token_usage(self) -> float:
        return self.tokens_in_use() / self.pool.size

    @property
    def busy(self) -> bool:
        return bool(
            self.waiting
            or self.running
            or self.retracted
            or self.prealloc
            or self.transfer
            or self.inflight
            or self.bootstrap_queue
        )
