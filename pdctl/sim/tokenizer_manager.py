"""Requests between the HTTP routes and the engine (SGLang's `tokenizer_manager.py` role):
validation, dispatch to the engine or a PD leg, the per-request event stream, request-level
metrics and `meta_info`.

`n` > 1 fans a request out into n samples, each an engine request with a fresh rid (as
_handle_batch_request's regenerate_rid); their events interleave as they come, tagged with
the sample's index. In PD each sample needs its own bootstrap room on both servers: the
gateway's list (smg sends one room per choice for chat) or, for a single room R, R + i (as
GenerateReqInput._normalize_bootstrap_params expands it). Real 0.5.23 then hands every
sample the first room (a bug that later upstream PRs address); the sim serves the intended
behaviour, see docs/sim.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from .args import SimConfig
from .decode import DecodeLeg
from .metrics import SimMetrics
from .mode import DisaggregationMode
from .prefill import PrefillLeg
from .protocol import BadRequest, Parsed
from .req import Abort, Event, Finish, Req, Token
from .sampling import Sample, Sampler
from .scheduler import Scheduler


@dataclass
class Outcome:
    """A sample's whole output, for a non-stream answer."""

    req: Req
    finish: Finish
    text: str = ""
    samples: list[Sample] = field(default_factory=list)


class TokenizerManager:
    def __init__(
        self,
        cfg: SimConfig,
        log: logging.Logger,
        engine: Scheduler,
        metrics: SimMetrics,
        spawn: Callable[[Awaitable[Any]], object],
    ) -> None:
        self.cfg, self.log, self.engine, self.metrics = cfg, log, engine, metrics
        self.spawn = spawn
        self.prefill_leg: PrefillLeg | None = None
        self.decode_leg: DecodeLeg | None = None
        self.inflight: set[Req] = set()
        self._rids = random.Random(cfg.knobs.seed)
        # /pause_generation (tokenizer_manager.is_pause, is_pause_cond): new requests wait at
        # `_unpaused` until /continue_generation; pause and continue take turns on the lock.
        self.is_pause = False
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._pause_lock = asyncio.Lock()

    def new_rid(self) -> str:
        """Request ids from the seed: the same request sequence gives the same texts."""
        return uuid.UUID(int=self._rids.getrandbits(128), version=4).hex

    def new_req(self, p: Parsed, log_metrics: bool = True, index: int = 0) -> Req:
        eos_limited = p.max_new_tokens is None and not p.sampling.ignore_eos
        budget = self.cfg.context_length - p.prompt_tokens
        max_new = (
            p.max_new_tokens
            if p.max_new_tokens is not None
            else min(self.cfg.knobs.output_tokens if eos_limited else budget, budget)
        )
        rid = p.rid if p.sampling.n == 1 else self.new_rid()
        if p.sampling.seed is not None:
            text = Sampler(p.sampling, p.sampling.seed, p.prompt_key)
        else:
            text = Sampler(p.sampling, self.cfg.knobs.seed, rid)
        room = p.bootstrap_room
        if index < len(p.rooms):
            room = p.rooms[index]
        elif room is not None:
            room += index
        return Req(
            rid=rid,
            prompt_tokens=p.prompt_tokens,
            max_new_tokens=max(max_new, 1),
            finish_reason="stop" if eos_limited else "length",
            stream=p.stream,
            text=text,
            created=self.engine.clock.now(),
            room=room,
            log_metrics=log_metrics,
        )

    def _validate(self, p: Parsed) -> None:
        """tokenizer_manager._validate_one_request."""
        if p.sampling.n < 1:
            raise BadRequest("n must be at least 1.")  # SGLang fails further in, on a 0 stride
        ctx = self.cfg.context_length
        if p.prompt_tokens >= ctx:
            raise BadRequest(
                f"The input ({p.prompt_tokens} tokens) is longer than the model's "
                f"context length ({ctx} tokens)."
            )
        if p.max_new_tokens is not None and p.max_new_tokens + p.prompt_tokens > ctx:
            raise BadRequest(
                "Requested token count exceeds the model's maximum context length of "
                f"{ctx} tokens. You requested a total of {p.max_new_tokens + p.prompt_tokens} "
                f"tokens: {p.prompt_tokens} tokens from the input messages and "
                f"{p.max_new_tokens} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit."
            )

    def dispatch(self, req: Req, p: Parsed | None = None, health: bool = False) -> None:
        mode = self.cfg.mode
        if health and mode is DisaggregationMode.DECODE:
            assert self.decode_leg is not None
            self.decode_leg.health(req)
        elif mode is DisaggregationMode.NULL or health:
            self.engine.submit_prefill(req)
        elif req.room is None and self.cfg.args.disaggregation_transfer_backend != "fake":
            message = (
                "Invalid request: Disaggregated request received without bootstrap "
                f"room id. req.rid={req.rid!r}"
            )
            self.log.error(message)
            self.engine.abort(req, message, HTTPStatus.BAD_REQUEST)
        elif mode is DisaggregationMode.PREFILL:
            assert self.prefill_leg is not None
            self.spawn(self.prefill_leg.run(req))
        else:
            assert self.decode_leg is not None and p is not None
            self.spawn(self.decode_leg.run(req, p.bootstrap_host or "", p.bootstrap_port or 0))

    async def wait_unpaused(self) -> None:
        """generate_request waits here, before tokenizing (so before the context checks)."""
        await self._unpaused.wait()

    async def pause_generation(self, mode: str) -> None:
        """tokenizer_manager.pause_generation: new requests wait from now on. Mode abort
        (the default) leaves the scheduler running and aborts every request in flight,
        again each second while any is left (model_update_lock.is_locked: requests past the
        gate hold its reader lock), so the call returns once they have ended; each round is
        one abort_request(abort_all=True), counted once in num_aborted_requests. The other
        modes pause the scheduler (scheduler.pause_generation)."""
        async with self._pause_lock:
            self.is_pause = True
            self._unpaused.clear()
            if mode != "abort":
                await self.engine.pause_generation(mode)
                return
            while True:
                for req in list(self.inflight):
                    self.engine.abort_graceful(req)
                self.metrics.tok_inc(self.metrics.num_aborted_requests)
                if not self.inflight:  # the aborted handlers have not answered yet: a round
                    return
                await self.engine.clock.sleep(1.0)

    async def continue_generation(self) -> None:
        """tokenizer_manager.continue_generation: the scheduler resumes (a no-op when it was
        not paused) and the waiting requests go on."""
        async with self._pause_lock:
            self.is_pause = False
            self.engine.continue_generation()
            self._unpaused.set()

    async def start(self, p: Parsed) -> list[Req]:
        """Validate and dispatch the request's n samples; also while SIGTERM's drain runs
        (generate_request does not look at gracefully_exit: the drain waits for them too)."""
        await self.wait_unpaused()
        self._validate(p)
        reqs = [self.new_req(p, index=i) for i in range(p.sampling.n)]
        for req in reqs:
            need = req.prompt_tokens + req.max_new_tokens
            if need > self.cfg.kv_pool_tokens:
                # A unified sim reserves a request's whole budget up front: it must fit the pool.
                raise BadRequest(
                    f"Request {req.rid} exceeds the maximum number of tokens: "
                    f"{need} > {self.cfg.kv_pool_tokens}"
                )
        for req in reqs:
            self.inflight.add(req)
            self.dispatch(req, p)
        return reqs

    async def stream(self, reqs: list[Req]) -> AsyncGenerator[tuple[int, Event], None]:
        """The samples' events as they come, with the sample's index (_stream_batch_responses)."""
        if len(reqs) == 1:  # the common case, without a task per event
            async with contextlib.aclosing(self.events(reqs[0])) as events:
                async for ev in events:
                    yield 0, ev
            return
        gens = [self.events(req) for req in reqs]
        pending = {asyncio.ensure_future(anext(g)): i for i, g in enumerate(gens)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=pending.__getitem__):
                    i = pending.pop(task)
                    try:
                        ev = task.result()
                    except StopAsyncIteration:
                        continue
                    yield i, ev
                    pending[asyncio.ensure_future(anext(gens[i]))] = i
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for g in gens:
                await g.aclose()

    async def collect(self, reqs: list[Req]) -> list[Outcome] | Abort:
        """Every sample's whole output, or the first abort (_collect_batch_responses)."""
        outcomes: dict[int, Outcome] = {}
        parts: dict[int, tuple[list[str], list[Sample]]] = {i: ([], []) for i in range(len(reqs))}
        async with contextlib.aclosing(self.stream(reqs)) as events:
            async for i, ev in events:
                if isinstance(ev, Abort):
                    return ev
                text, samples = parts[i]
                if isinstance(ev, Token):
                    text.append(ev.text)
                    if ev.sample is not None:
                        samples.append(ev.sample)
                else:
                    text.append(ev.tail)
                    outcomes[i] = Outcome(reqs[i], ev, "".join(text), samples)
        return [outcomes[i] for i in range(len(reqs))]

    async def events(self, req: Req) -> AsyncGenerator[Event, None]:
        try:
            while True:
                ev = await req.out.get()
                yield ev
                if not isinstance(ev, Token):
                    return
        finally:
            self.inflight.discard(req)
            if not req.done:
                self.engine.cancel(req)
            self._observe_finished(req)

    def _observe_finished(self, req: Req) -> None:
        m = self.metrics
        if not req.log_metrics:
            return
        stream = str(req.stream).lower()
        now = self.engine.clock.now()
        m.tok_inc(m.prompt_tokens, req.prompt_tokens, is_streaming=stream)
        m.tok_inc(m.generation_tokens, req.generated, is_streaming=stream)
        m.tok_inc(m.num_requests, is_streaming=stream)
        m.tok_observe(m.prompt_tokens_histogram, req.prompt_tokens)
        m.tok_observe(m.uncached_prompt_tokens_histogram, req.prompt_tokens)  # no prefix cache
        m.tok_observe(m.generation_tokens_histogram, req.generated)
        m.tok_observe(m.e2e_request_latency, now - req.created, is_streaming=stream)
        if req.first_token_at is not None:
            m.tok_observe(
                m.time_to_first_token, req.first_token_at - req.created, is_streaming=stream
            )
            if req.generated > 1 and req.last_token_at is not None:
                m.tok_observe(
                    m.request_time_per_output_token,
                    (req.last_token_at - req.first_token_at) / (req.generated - 1),
                    is_streaming=stream,
                )

    def meta(
        self,
        req: Req,
        finish: Event | None,
        samples: list[Sample] | None = None,
        text_in_logprobs: bool = False,
    ) -> dict[str, Any]:
        """meta_info of an output: with return_logprob, the output tokens' (logprob, id,
        text) triples (text only with return_text_in_logprobs); the sim models no input
        logprobs."""
        reason: dict[str, Any] | None = None
        if isinstance(finish, Finish) and finish.reason == "abort":
            reason = {"type": "abort", **dict(finish.abort)}
        elif isinstance(finish, Finish):
            reason = (
                {"type": "length", "length": req.generated}
                if finish.reason == "length"
                else {"type": "stop", "matched": finish.matched}
            )
        elif isinstance(finish, Abort):
            reason = {"type": "abort", "message": finish.message, "status_code": int(finish.status)}
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": req.generated,
            "cached_tokens": 0,
            "e2e_latency": self.engine.clock.now() - req.created,
        }
        params = req.text.params
        if params.logprobs:
            samples = samples or []

            def text(piece: str) -> str | None:
                return piece if text_in_logprobs else None

            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [
                [s.logprob, s.token_id, text(s.piece)] for s in samples
            ]
            meta["output_token_logprobs_length"] = len(samples)
            if params.top_logprobs > 0:
                meta["input_top_logprobs"] = []
                meta["output_top_logprobs"] = [
                    [[lp, tid, text(piece)] for lp, tid, piece in s.top] for s in samples
                ]
        return meta
