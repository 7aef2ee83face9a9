"""Health, info, load and metrics routes (SGLang's `http_server.py` and `v1_loads.py`)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from . import __version__
from .args import GIB
from .protocol import Parsed, json_response
from .req import Req

if TYPE_CHECKING:
    from .server import SimServer

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # disaggregation/utils.py: health checks never reach a peer
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT
# load_snapshot.py LoadSnapshot.VALID_SECTIONS: what /v1/loads?include= may name.
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
# The snapshot's sections the sim has (no speculative or LoRA section), by include name.
SECTION_NAMES = (("memory", "memory"), ("disaggregation", "disagg"), ("queues", "queues"))


class InfoRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.cfg, self.engine = server.cfg, server.engine

    async def health(self, request: web.Request) -> web.Response:
        """http_server.health_generate: 503 while starting or shutting down; else a 1-token
        generate, which waits like any request while generation is paused (so a paused
        server answers 503 after the timeout). A timeout marks the server unhealthy (/ready
        and /ping 503) until a check passes again."""
        if self.server.status == "stopping":
            self.server.log.info("Health check request received during shutdown. Returning 503.")
            return web.Response(status=503)
        if self.server.status == "starting":
            return web.Response(status=503)
        # A 1-token generate with a fake bootstrap host: the peer is never contacted.
        req = self.server.tm.new_req(
            Parsed(
                prompt_tokens=1,
                prompt_key="",
                max_new_tokens=1,
                stream=False,
                rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
                bootstrap_host=FAKE_BOOTSTRAP_HOST,
                bootstrap_port=None,
                bootstrap_room=0,
                include_usage=False,
                model="",
            ),
            log_metrics=False,
        )
        req.fake_bootstrap = True
        try:
            await asyncio.wait_for(
                self._generate(req), self.engine.clock.wall(HEALTH_CHECK_TIMEOUT_S)
            )
        except TimeoutError:
            self.engine.cancel(req)
            self.server.log.error(
                "Health check failed. Server couldn't get a response from "
                "detokenizer for last %s seconds.",
                HEALTH_CHECK_TIMEOUT_S,
            )
            if self.server.status == "up":
                self.server.status = "unhealthy"
            return web.Response(status=503)
        self.engine.cancel(req)
        if self.server.status == "unhealthy":
            self.server.status = "up"
        return web.Response(status=200)

    async def _generate(self, req: Req) -> None:
        await self.server.tm.wait_unpaused()
        self.server.tm.dispatch(req, health=True)
        await req.out.get()

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
            optimistic_prefill_attempts=self.cfg.optimistic_prefill_attempts,
            load_balance_method=self.cfg.load_balance_method,
        )
        e = self.engine
        a.update(
            max_total_num_tokens=self.cfg.kv_pool_tokens,
            startup_time=self.server.started_at,
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
        return json_response(a, dump=lambda o: json.dumps(o, default=str, separators=(",", ":")))

    async def model_info(self, _: web.Request) -> web.Response:
        return json_response(
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
                "disaggregation_mode": self.cfg.mode.value,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "pdsim",
                "architectures": ["PdSimForCausalLM"],
            }
        )

    async def models(self, _: web.Request) -> web.Response:
        name = self.cfg.served_model_name
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.server.started_at),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.cfg.context_length,
                    }
                ],
            }
        )

    async def loads(self, request: web.Request) -> web.Response:
        """entrypoints/v1_loads.py over scheduler_components/load_inquirer.py get_loads: one
        LoadSnapshot per DP rank (the sim has one), its sections filtered by `include`."""
        include = request.query.get("include")
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= LOAD_SECTIONS:
            detail = (
                f"Invalid include sections: {sections - LOAD_SECTIONS}. "
                f"Valid options: {sorted(LOAD_SECTIONS)}"
            )
            return json_response({"detail": detail}, status=400)
        load = self.load_snapshot()
        if sections is not None and "all" not in sections:
            for field, name in SECTION_NAMES:
                if name not in sections:
                    del load[field]
        return json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": __version__,
                "accelerator": None,
                "num_accelerators": self.cfg.args.tp_size,
                "loads": [load],
            }
        )

    def load_snapshot(self) -> dict[str, object]:
        """LoadInquirer.get_loads: the waiting count takes in the disaggregation queues
        (a prefill's bootstrap queue; a decode's prealloc, transfer and retracted queues),
        which is what the gateway's overload protection reads."""
        e, cfg, k = self.engine, self.cfg, self.cfg.knobs
        used = e.tokens_in_use()
        lq = e.load_queues()
        q = e.disagg_queues()
        total = used + sum(r.prompt_tokens for r in lq.pending)
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(e.running),
            "num_waiting_reqs": len(lq.waiting),
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in e.waiting),
            "num_used_tokens": used,
            "num_total_tokens": total,
            "num_active_tokens": max(0, total - lq.awaiting_kv_tokens),
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cfg.kv_pool_tokens,
            "max_running_requests": cfg.max_running_requests,
            "token_usage": round(used / cfg.kv_pool_tokens, 4),
            "gen_throughput": round(e.last_gen_throughput, 2),
            "cache_hit_rate": 0.0,
            "utilization": round(min(len(e.running) / cfg.max_running_requests, 1.0), 4),
            "total_prefill_uncached_tokens": 0,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {
                "weight_gb": round(k.weights_gib, 3),
                "kv_cache_gb": round(cfg.kv_pool_tokens * k.kv_bytes_per_token / GIB, 3),
                "graph_gb": round(self.server.graph_gib, 3),
                "token_capacity": cfg.kv_pool_tokens,
            },
            "disaggregation": {
                "mode": cfg.mode.value,
                "prefill_bootstrap_queue_reqs": q.bootstrap,
                "prefill_inflight_queue_reqs": q.inflight,
                "decode_prealloc_queue_reqs": q.prealloc,
                "decode_transfer_queue_reqs": q.transfer,
                "decode_retracted_queue_reqs": q.retracted,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
            "queues": {
                "waiting": len(e.waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": e.last_retracted,
                "prealloc_ready": 0,
            },
        }

    async def flush_cache(self, _: web.Request) -> web.Response:
        if self.engine.busy:
            return web.Response(text="Flush cache failed.\n", status=400)
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encoder(self.server.metrics.exposed), headers={"Content-Type": content_type}
        )
