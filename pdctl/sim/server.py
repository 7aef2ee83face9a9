"""SGLang's HTTP API over the simulated engine (aiohttp).

Bodies, status codes and error shapes follow sglang 0.5.23 (`entrypoints/http_server.py`,
`entrypoints/openai/serving_{base,chat,completions}.py`, `managers/tokenizer_manager.py`):
- /generate: non-stream errors `{"error": {"message": ...}}` (400) or, for a 500 abort,
  the ErrorResponse `{"object": "error", "message", "type": "500", "param": null, "code"}`;
  a stream carries aborts in `meta_info.finish_reason` and then `data: [DONE]`.
- OpenAI routes: `{"object": "error", "message", "type": "BadRequestError", "param": null,
  "code": 400}`; a stream waits for its first chunk (so validation errors stay HTTP 400)
  and carries later aborts as an error chunk whose type is the status name.
- Malformed JSON: FastAPI's validation error, turned into 400 with type "Bad Request".
- Unknown body fields are ignored (SGLang's request models allow extras).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from . import __version__
from .args import GIB, SimConfig
from .bootstrap import BootstrapServer
from .engine import Abort, Engine, Event, Finish, Req, Token
from .metrics import SimMetrics
from .model import FakeText, count_tokens
from .pd import DecodeLeg, PrefillLeg

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # disaggregation/utils.py: health checks never reach a peer
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    """SGLang's ValueError path: HTTP 400."""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(body: Any, status: int = 200, dumps: Callable[[Any], str] = _dumps) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


def openai_error(
    message: str, status: int = 400, err_type: str = "BadRequestError"
) -> web.Response:
    body = {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return _json(body, status)


def json_decode_error(e: json.JSONDecodeError) -> web.Response:
    """FastAPI's RequestValidationError for a body that is not JSON, as SGLang reshapes it."""
    errors = [
        {
            "type": "json_invalid",
            "loc": ("body", e.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": e.msg},
        }
    ]
    return openai_error(f"{errors}", 400, HTTPStatus.BAD_REQUEST.phrase)


def validation_error(kind: str, loc: tuple[str, ...], msg: str, value: Any) -> web.Response:
    """A pydantic validation failure as SGLang reshapes FastAPI's RequestValidationError."""
    errors = [{"type": kind, "loc": loc, "msg": msg, "input": value}]
    return openai_error(f"{errors}", 400, HTTPStatus.BAD_REQUEST.phrase)


def _as_int(value: Any) -> int | None:
    """An integer request field, None when it is not one (strings of digits pass, as in
    pydantic's lax mode)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


@dataclass
class Parsed:
    prompt_tokens: int
    max_new_tokens: int | None
    stream: bool
    rid: str
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    include_usage: bool
    model: str
    ignore_eos: bool = False


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def _pd_fields(body: dict[str, Any]) -> tuple[str | None, int | None, int | None]:
    port = _first(body.get("bootstrap_port"))
    room = _first(body.get("bootstrap_room"))
    return (
        _first(body.get("bootstrap_host")),
        (int(port) if port is not None else None),
        (int(room) if room is not None else None),
    )


class SimServer:
    def __init__(self, cfg: SimConfig, log: logging.Logger) -> None:
        self.cfg = cfg
        self.log = log
        self.metrics = (
            SimMetrics(cfg.served_model_name, cfg.engine_type) if cfg.args.enable_metrics else None
        )
        self.engine = Engine(cfg, self.metrics, log)
        self.status = "starting"
        self.boot = (
            BootstrapServer(
                self.engine.clock,
                log,
                cfg.degraded_enabled,
                cfg.knobs.bootstrap_timeout_s + cfg.knobs.waiting_timeout_s,
            )
            if cfg.mode == "prefill"
            else None
        )
        self.prefill_leg = (
            PrefillLeg(cfg, self.engine, self.boot, self.metrics, log) if self.boot else None
        )
        self.decode_leg: DecodeLeg | None = None
        self.http: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.inflight: set[Req] = set()
        self.started_at = time.time()
        self._rids = random.Random(cfg.knobs.seed)
        self.app = web.Application(middlewares=[self._http_metrics], client_max_size=64 * 2**20)
        r = self.app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/v1/loads", self.loads)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        if self.metrics:
            r.add_get("/metrics", self.metrics_endpoint)

    def _new_rid(self) -> str:
        """Request ids from the seed: the same request sequence gives the same texts."""
        return uuid.UUID(int=self._rids.getrandbits(128), version=4).hex

    @property
    def url(self) -> str:
        return f"http://{self.cfg.args.host}:{self.cfg.args.port}"

    # ----- lifecycle -----------------------------------------------------------------
    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def startup(self) -> None:
        """Weights load + graph capture, then serve."""
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        if self.cfg.mode == "decode":
            self.decode_leg = DecodeLeg(
                self.cfg, self.engine, self.metrics, self.log, self.http, self.spawn
            )
        await self._load_and_capture()
        self.spawn(self.engine.run())
        self.engine.publish_static_metrics()
        if self.boot is not None:
            await self._register_prefill_rank()
        self.status = "up"
        self.log.info("The server is fired up and ready to roll!")

    async def _load_and_capture(self) -> None:
        """SGLang's startup lines (model_runner.py, cuda_graph_setup.py, scheduler.py) over
        PDSIM_STARTUP_DELAY_S: 60% loading weights, 40% capturing decode graphs (a prefill
        server captures none: cuda_graph_hook disables them for its role)."""
        cfg, k, clock = self.cfg, self.cfg.knobs, self.engine.clock
        avail = k.gpu_mem_gib - 0.5
        self.log.info("Load weight begin. avail mem=%.2f GB", avail)
        await clock.sleep(0.6 * k.startup_delay_s)
        avail -= k.weights_gib
        self.log.info(
            "Load weight end. elapsed=%.2f s, type=PdSimForCausalLM, avail mem=%.2f GB, "
            "mem usage=%.2f GB.",
            0.6 * k.startup_delay_s,
            avail,
            k.weights_gib,
        )
        avail -= cfg.kv_pool_tokens * k.kv_bytes_per_token / GIB
        if cfg.mode != "prefill":
            self.log.info(
                "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                "avail mem=%.2f GB",
                avail,
            )
            await clock.sleep(0.4 * k.startup_delay_s)
            graph_gib = min(max(avail - 0.5, 0.0), 0.5 + 0.02 * max(cfg.decode_buckets))
            avail -= graph_gib
            self.log.info(
                "Capture target decode CUDA graph end. bs=%s, elapsed=%.2f s, "
                "mem usage=%.2f GB, avail mem=%.2f GB.",
                cfg.decode_buckets,
                0.4 * k.startup_delay_s,
                graph_gib,
                avail,
            )
        self.log.info(
            "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=16384, "
            "max_running_requests=%d, context_len=%d, available_gpu_mem=%.2f GB",
            cfg.kv_pool_tokens,
            cfg.chunked_prefill_size,
            cfg.max_running_requests,
            cfg.context_length,
            avail,
        )

    async def _register_prefill_rank(self) -> None:
        a = self.cfg.args
        payload = {
            "attn_tp_size": a.tp_size,
            "attn_tp_rank": 0,
            "attn_cp_size": 1,
            "attn_cp_rank": 0,
            "attn_dp_size": a.dp_size,
            "attn_dp_rank": 0,
            "pp_size": a.pp_size,
            "pp_rank": 0,
            "system_dp_size": 1,
            "system_dp_rank": 0,
            "rank_ip": a.host,
            "rank_port": a.disaggregation_bootstrap_port,
            "page_size": self.cfg.page_size,
            "kv_cache_dtype": a.kv_cache_dtype,
            "prefill_http_port": a.port,
        }
        assert self.http is not None
        url = f"http://{a.host}:{a.disaggregation_bootstrap_port}/route"
        async with self.http.put(url, json=payload) as resp:
            resp.raise_for_status()

    async def shutdown(self) -> None:
        """SIGTERM: refuse new work (health 503), let in-flight requests finish, abort the rest."""
        self.status = "stopping"
        clock = self.engine.clock
        deadline = clock.now() + self.cfg.knobs.shutdown_timeout_s
        while self.inflight and clock.now() < deadline:
            await asyncio.sleep(0.05)
        for req in list(self.inflight):
            self.engine.abort(req, "The server is shutting down.", HTTPStatus.SERVICE_UNAVAILABLE)
        await asyncio.sleep(0.05)
        for task in list(self.tasks):
            task.cancel()
        if self.http is not None:
            await self.http.close()

    # ----- middleware ----------------------------------------------------------------
    @web.middleware
    async def _http_metrics(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        m = self.metrics
        if m is None:
            return await handler(request)
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else request.path
        m.http_requests.labels(endpoint=endpoint, method=request.method).inc()
        active = m.http_requests_active.labels(endpoint=endpoint, method=request.method)
        active.inc()
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            active.dec()
            m.http_responses.labels(
                endpoint=endpoint, status_code=str(status), method=request.method
            ).inc()

    # ----- info endpoints ------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.status != "up":
            return web.Response(status=503)
        # A 1-token generate with a fake bootstrap host: the peer is never contacted.
        req = self._new_req(
            Parsed(
                1,
                1,
                False,
                f"HEALTH_CHECK_{uuid.uuid4().hex}",
                FAKE_BOOTSTRAP_HOST,
                None,
                0,
                False,
                "",
            ),
            log_metrics=False,
        )
        req.fake_bootstrap = True
        self._dispatch(req, health=True)
        try:
            await asyncio.wait_for(req.out.get(), self.engine.clock.wall(HEALTH_CHECK_TIMEOUT_S))
        except TimeoutError:
            self.engine.cancel(req)
            self.log.error(
                "Health check failed. Server couldn't get a response from "
                "detokenizer for last %s seconds.",
                HEALTH_CHECK_TIMEOUT_S,
            )
            return web.Response(status=503)
        self.engine.cancel(req)
        return web.Response(status=200)

    async def server_info(self, _: web.Request) -> web.Response:
        a = vars(self.cfg.args).copy()
        a.update(
            served_model_name=self.cfg.served_model_name,
            page_size=self.cfg.page_size,
            context_length=self.cfg.context_length,
            max_running_requests=self.cfg.max_running_requests,
            chunked_prefill_size=self.cfg.chunked_prefill_size,
            cuda_graph_bs_decode=self.cfg.decode_buckets,
            cuda_graph_max_bs_decode=max(self.cfg.decode_buckets),
        )
        e = self.engine
        a.update(
            max_total_num_tokens=self.cfg.kv_pool_tokens,
            startup_time=self.started_at,
            internal_states=[
                {
                    "last_gen_throughput": e.last_gen_throughput,
                    "num_running_reqs": len(e.running),
                    "num_queue_reqs": len(e.waiting),
                    "token_usage": round(e.token_usage, 2),
                }
            ],
            version=__version__,
            pdsim={"knobs": vars(self.cfg.knobs), "unknown_args": self.cfg.unknown},
        )
        return _json(a, dumps=lambda o: json.dumps(o, default=str, separators=(",", ":")))

    async def model_info(self, _: web.Request) -> web.Response:
        return _json(
            {
                "model_path": self.cfg.args.model_path,
                "served_model_name": self.cfg.served_model_name,
                "tokenizer_path": self.cfg.args.tokenizer_path or self.cfg.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": self.cfg.args.load_format,
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": self.cfg.mode,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "pdsim",
                "architectures": ["PdSimForCausalLM"],
            }
        )

    async def models(self, _: web.Request) -> web.Response:
        name = self.cfg.served_model_name
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.started_at),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.cfg.context_length,
                    }
                ],
            }
        )

    async def loads(self, _: web.Request) -> web.Response:
        """entrypoints/v1_loads.py: one LoadSnapshot per DP rank (the sim has one)."""
        e, cfg = self.engine, self.cfg
        used = e.tokens_in_use()
        load = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(e.running),
            "num_waiting_reqs": len(e.waiting),
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in e.waiting),
            "num_used_tokens": used,
            "num_total_tokens": used,
            "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cfg.kv_pool_tokens,
            "max_running_requests": cfg.max_running_requests,
            "token_usage": round(used / cfg.kv_pool_tokens, 2),
            "gen_throughput": e.last_gen_throughput,
            "cache_hit_rate": 0.0,
            "utilization": min(len(e.running) / cfg.max_running_requests, 1.0),
            "disaggregation": {
                "mode": cfg.mode,
                "prefill_bootstrap_queue_reqs": len(e.bootstrap_queue),
                "prefill_inflight_queue_reqs": len(e.inflight),
                "decode_prealloc_queue_reqs": len(e.prealloc),
                "decode_transfer_queue_reqs": len(e.transfer),
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
        }
        return _json(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": __version__,
                "accelerator": None,
                "num_accelerators": cfg.args.tp_size,
                "loads": [load],
            }
        )

    async def flush_cache(self, _: web.Request) -> web.Response:
        if self.engine.busy:
            return web.Response(text="Flush cache failed.\n", status=400)
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        assert self.metrics is not None
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encoder(self.metrics.exposed), headers={"Content-Type": content_type}
        )

    # ----- generation plumbing -------------------------------------------------------
    def _new_req(self, p: Parsed, log_metrics: bool = True) -> Req:
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

    def _dispatch(self, req: Req, p: Parsed | None = None, health: bool = False) -> None:
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

    async def _start(self, p: Parsed) -> Req:
        self._validate(p)
        if self.status == "stopping":
            raise web.HTTPServiceUnavailable()
        req = self._new_req(p)
        need = req.prompt_tokens + req.max_new_tokens
        if need > self.cfg.kv_pool_tokens:
            # The sim reserves a request's whole budget up front, so it must fit the pool.
            raise BadRequest(
                f"Request {req.rid} exceeds the maximum number of tokens: "
                f"{need} > {self.cfg.kv_pool_tokens}"
            )
        self.inflight.add(req)
        self._dispatch(req, p)
        return req

    async def _events(self, req: Req) -> AsyncGenerator[Event, None]:
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

    def _meta(self, req: Req, finish: Event | None) -> dict[str, Any]:
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

    # ----- /generate -----------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as e:
            return json_decode_error(e)
        if not isinstance(body, dict):
            kind = "sequence" if isinstance(body, list) else type(body).__name__
            return _json(
                {"error": f"invalid type: {kind}, expected struct GenerateRequest"}, status=400
            )
        sp = body.get("sampling_params") or {}
        text = _first(body.get("text"))
        ids = body.get("input_ids")
        if text is None and ids is None:
            return _json(
                {
                    "error": {
                        "message": "Either text, input_ids or input_embeds should be provided."
                    }
                },
                status=400,
            )
        max_new = sp.get("max_new_tokens", 128)
        if _as_int(max_new) is None or isinstance(max_new, str):
            # The JSON contract check (api/v1 GenerateRequest) answers in serde's words.
            kind = f'string "{max_new}"' if isinstance(max_new, str) else type(max_new).__name__
            return _json({"error": f"invalid type: {kind}, expected i64"}, status=400)
        if text is not None:
            prompt_tokens = count_tokens(str(text))
        else:
            first = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) else ids
            prompt_tokens = len(first) if isinstance(first, list) else 1
        host, port, room = _pd_fields(body)
        p = Parsed(
            prompt_tokens=prompt_tokens,
            max_new_tokens=int(max_new),
            stream=bool(body.get("stream", False)),
            rid=str(_first(body.get("rid")) or self._new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=False,
            model=self.cfg.served_model_name,
            ignore_eos=bool(sp.get("ignore_eos", False)),
        )
        try:
            req = await self._start(p)
        except BadRequest as e:
            return _json({"error": {"message": str(e)}}, status=400)
        if not p.stream:
            text_out = ""
            async for ev in self._events(req):
                if isinstance(ev, Token):
                    text_out += ev.text
                elif isinstance(ev, Abort):
                    return self._generate_abort(ev)
                else:
                    return _json({"text": text_out, "meta_info": self._meta(req, ev)})
        resp = await self._sse(request)
        text_out = ""
        async for ev in self._events(req):
            if isinstance(ev, Token):
                text_out += ev.text
                # The finish event right behind the last token goes out in the same chunk.
                if not req.out.empty():
                    continue
                await resp.write(self._gen_chunk(text_out, req, None))
            else:
                await resp.write(self._gen_chunk(text_out, req, ev))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _gen_chunk(self, text: str, req: Req, finish: Event | None) -> bytes:
        body = {"text": text, "meta_info": self._meta(req, finish), "index": 0}
        return f"data: {_dumps(body)}\n\n".encode()

    @staticmethod
    def _generate_abort(ev: Abort) -> web.Response:
        if ev.status == HTTPStatus.BAD_REQUEST:
            return _json({"error": {"message": ev.message}}, status=400)
        return openai_error(ev.message, int(ev.status), str(int(ev.status)))

    @staticmethod
    async def _sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    # ----- OpenAI routes -------------------------------------------------------------
    async def _openai_body(
        self, request: web.Request, required: str
    ) -> dict[str, Any] | web.Response:
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as e:
            return json_decode_error(e)
        if not isinstance(body, dict):
            return validation_error(
                "model_attributes_type",
                ("body",),
                "Input should be a valid dictionary or object to extract fields from",
                body,
            )
        if required not in body:
            return validation_error("missing", ("body", required), "Field required", body)
        return body

    def _openai_parsed(
        self, body: dict[str, Any], prompt_tokens: int, field: str, max_tokens: Any
    ) -> Parsed | web.Response:
        if max_tokens is not None and _as_int(max_tokens) is None:
            return validation_error(
                "int_parsing",
                ("body", field),
                "Input should be a valid integer, unable to parse string as an integer",
                max_tokens,
            )
        host, port, room = _pd_fields(body)
        opts = body.get("stream_options") or {}
        return Parsed(
            prompt_tokens=prompt_tokens,
            max_new_tokens=_as_int(max_tokens),
            stream=bool(body.get("stream", False)),
            rid=str(body.get("rid") or self._new_rid()),
            bootstrap_host=host,
            bootstrap_port=port,
            bootstrap_room=room,
            include_usage=bool(opts.get("include_usage", False)),
            model=str(body.get("model") or self.cfg.served_model_name),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._openai_body(request, "prompt")
        if isinstance(body, web.Response):
            return body
        prompt = _first(body["prompt"])
        tokens = len(prompt) if isinstance(prompt, list) else count_tokens(str(prompt))
        p = self._openai_parsed(body, tokens, "max_tokens", body.get("max_tokens", 16))
        if isinstance(p, web.Response):
            return p
        return await self._openai_run(request, p, "text_completion", "cmpl")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._openai_body(request, "messages")
        if isinstance(body, web.Response):
            return body
        messages = body["messages"]
        if not isinstance(messages, list):
            return validation_error(
                "list_type", ("body", "messages"), "Input should be a valid list", messages
            )
        # Chat template stand-in: "<role>: <content>\n" per message.
        prompt = "".join(
            f"{m.get('role', '')}: {m.get('content', '')}\n"
            for m in messages
            if isinstance(m, dict)
        )
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        p = self._openai_parsed(body, count_tokens(prompt), field, body.get(field))
        if isinstance(p, web.Response):
            return p
        return await self._openai_run(request, p, "chat.completion", "chatcmpl")

    async def _openai_run(
        self, request: web.Request, p: Parsed, obj: str, prefix: str
    ) -> web.StreamResponse:
        try:
            req = await self._start(p)
        except BadRequest as e:
            return openai_error(str(e))
        chat = obj == "chat.completion"
        rid = f"{prefix}-{req.rid}" if not req.rid.startswith(prefix) else req.rid
        created = int(time.time())
        events = self._events(req)
        if not p.stream:
            text = ""
            async for out in events:
                if isinstance(out, Token):
                    text += out.text
                elif isinstance(out, Abort):
                    if out.status == HTTPStatus.BAD_REQUEST:
                        return openai_error(out.message)
                    return openai_error(out.message, int(out.status), str(int(out.status)))
                else:
                    choice: dict[str, Any] = {
                        "index": 0,
                        "logprobs": None,
                        "finish_reason": out.reason,
                        "matched_stop": None,
                    }
                    if chat:
                        choice["message"] = {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": None,
                            "tool_calls": None,
                        }
                    else:
                        choice["text"] = text
                    return _json(
                        {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": p.model,
                            "choices": [choice],
                            "usage": self._usage(req),
                        }
                    )
        # Wait for the first event before answering 200, as serving_chat does.
        first = await anext(events)
        resp = await self._sse(request)
        chunk_obj = f"{obj}.chunk" if chat else obj
        role_sent = False

        async def send(delta_text: str | None, finish: str | None) -> None:
            nonlocal role_sent
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            if chat:
                delta: dict[str, Any] = {}
                if not role_sent:
                    delta["role"] = "assistant"
                    role_sent = True
                if delta_text is not None:
                    delta["content"] = delta_text
                choice["delta"] = delta
            else:
                choice["text"] = delta_text or ""
            chunk = {
                "id": rid,
                "object": chunk_obj,
                "created": created,
                "model": p.model,
                "choices": [choice],
                "usage": None,
            }
            await resp.write(f"data: {_dumps(chunk)}\n\n".encode())

        ev: Event | None = first
        while ev is not None:
            if isinstance(ev, Abort):
                # serving_base.create_streaming_error_response wraps it: {"error": {...}}.
                err = {
                    "object": "error",
                    "message": ev.message,
                    "type": ev.status.name,
                    "param": None,
                    "code": int(ev.status),
                }
                await resp.write(f"data: {_dumps({'error': err})}\n\n".encode())
                break
            if isinstance(ev, Token):
                if chat and not role_sent:
                    await send("", None)
                await send(ev.text, None)
            else:
                assert isinstance(ev, Finish)
                await send(None if chat else "", ev.reason)
                if p.include_usage:
                    chunk = {
                        "id": rid,
                        "object": chunk_obj,
                        "created": created,
                        "model": p.model,
                        "choices": [],
                        "usage": self._usage(req),
                    }
                    await resp.write(f"data: {_dumps(chunk)}\n\n".encode())
                break
            ev = await anext(events, None)
        await events.aclose()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @staticmethod
    def _usage(req: Req) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }


@dataclass
class Listener:
    runner: web.AppRunner
    site: web.TCPSite


async def listen(app: web.Application, host: str, port: int) -> Listener:
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    return Listener(runner, site)


@contextlib.asynccontextmanager
async def running(cfg: SimConfig, log: logging.Logger) -> AsyncIterator[SimServer]:
    """Serve the HTTP API (and a prefill's bootstrap server); starting up in the background,
    shutting down gracefully on exit."""
    server = SimServer(cfg, log)
    a = cfg.args
    listeners = []
    if server.boot is not None:
        listeners.append(await listen(server.boot.app, a.host, a.disaggregation_bootstrap_port))
    listeners.append(await listen(server.app, a.host, a.port))
    startup = asyncio.ensure_future(server.startup())
    try:
        yield server
    finally:
        startup.cancel()
        await server.shutdown()
        for listener in reversed(listeners):
            await listener.runner.cleanup()
