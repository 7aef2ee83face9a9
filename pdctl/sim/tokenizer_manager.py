"""Requests between the HTTP routes and the engine (SGLang's `tokenizer_manager.py` role):
validation, dispatch to the engine or a PD leg, the per-request event stream, request-level
metrics and `meta_info`."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .args import SimConfig
from .engine import Abort, Engine, Event, Finish, Req, Token
from .metrics import SimMetrics
from .model import FakeText
from .pd import DecodeLeg, PrefillLeg
from .protocol import BadRequest, Parsed


class TokenizerManager:
    def __init__(
        self,
        cfg: SimConfig,
        log: logging.Logger,
        engine: Engine,
        metrics: SimMetrics | None,
        spawn: Callable[[Awaitable[Any]], object],
        status: Callable[[], str],
    ) -> None:
        self.cfg, self.log, self.engine, self.metrics = cfg, log, engine, metrics
        self.spawn = spawn
        self.status = status
        self.prefill_leg: PrefillLeg | None = None
        self.decode_leg: DecodeLeg | None = None
        self.inflight: set[Req] = set()
        self._rids = random.Random(cfg.knobs.seed)

    def new_rid(self) -> str:
        """Request ids from the seed: the same request sequence gives the same texts."""
        return uuid.UUID(int=self._rids.getrandbits(128), version=4).hex

    def new_req(self, p: Parsed, log_metrics: bool = True) -> Req:
        eos_limited = p.max_new_tokens is None and not p.ignore_eos
        budget = self.cfg.context_length - p.prompt_tokens
        max_new = (
            p.max_new_tokens
            if p.max_new_tokens is not None
            else min(self.cfg.knobs.output_tokens if eos_limited else budget, budget)
        )
        return Req(
            rid=p.rid,
            prompt_tokens=p.prompt_tokens,
            max_new_tokens=max(max_new, 1),
            finish_reason="stop" if eos_limited else "length",
            stream=p.stream,
            text=FakeText(self.cfg.knobs.seed, p.rid),
            created=self.engine.clock.now(),
            room=p.bootstrap_room,
            log_metrics=log_metrics,
        )

    def _validate(self, p: Parsed) -> None:
        """tokenizer_manager._validate_one_request."""
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
        if health and mode == "decode":
            # FakeKVReceiver: no peer, no KV; the single token comes out at once.
            self.engine.transfer.add(req)
            self.engine.start_decoding(req)
        elif mode == "null" or health:
            self.engine.submit_prefill(req)
        elif req.room is None and self.cfg.args.disaggregation_transfer_backend != "fake":
            message = (
                "Invalid request: Disaggregated request received without bootstrap "
                f"room id. req.rid={req.rid!r}"
            )
            self.log.error(message)
            self.engine.abort(req, message, HTTPStatus.BAD_REQUEST)
        elif mode == "prefill":
            assert self.prefill_leg is not None
            self.spawn(self.prefill_leg.run(req))
        else:
            assert self.decode_leg is not None and p is not None
            self.spawn(self.decode_leg.run(req, p.bootstrap_host or "", p.bootstrap_port or 0))

    async def start(self, p: Parsed) -> Req:
        self._validate(p)
        if self.status() == "stopping":
            raise web.HTTPServiceUnavailable()
        req = self.new_req(p)
        need = req.prompt_tokens + req.max_new_tokens
        if need > self.cfg.kv_pool_tokens:
            # The sim reserves a request's whole budget up front, so it must fit the pool.
            raise BadRequest(
                f"Request {req.rid} exceeds the maximum number of tokens: "
                f"{need} > {self.cfg.kv_pool_tokens}"
            )
        self.inflight.add(req)
        self.dispatch(req, p)
        return req

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
        if m is None or not req.log_metrics:
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

    def meta(self, req: Req, finish: Event | None) -> dict[str, Any]:
        reason: dict[str, Any] | None = None
        if isinstance(finish, Finish):
            reason = (
                {"type": "length", "length": req.generated}
                if finish.reason == "length"
                else {"type": "stop", "matched": 2}
            )
        elif isinstance(finish, Abort):
            reason = {"type": "abort", "message": finish.message, "status_code": int(finish.status)}
        return {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": req.generated,
            "cached_tokens": 0,
            "e2e_latency": self.engine.clock.now() - req.created,
        }
