"""SGLang's HTTP server over the simulated engine (aiohttp): the route table, start-up,
shutdown and the HTTP metrics middleware (SGLang's `entrypoints/http_server.py`).

The routes live next to it, split as SGLang splits its HTTP layer: `info.py` (health,
server/model info, loads, metrics), `generate.py` (native /generate), `serving_base.py`,
`serving_completions.py` and `serving_chat.py` (OpenAI), `streaming.py` (SSE),
`protocol.py` (request fields, error bodies) and `tokenizer_manager.py` (requests between
the routes and the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NoReturn

import aiohttp
from aiohttp import web

from pdctl.model import weights

from .args import GIB, SimConfig
from .bootstrap import BootstrapServer
from .conn import HttpKVReceiver, HttpKVSender, KVReceiver, KVSender
from .control import ControlRoutes
from .decode import DecodeLeg
from .generate import NativeGenerate
from .handshake import registration
from .info import InfoRoutes
from .metrics import NoMetrics, SimMetrics, Startup
from .mode import DisaggregationMode
from .nixl_conn import NixlKV, NixlKVReceiver, NixlKVSender
from .prefill import PrefillLeg
from .procs import WATCHDOG_INTERVAL_S, Tree
from .scheduler import Scheduler
from .scheduler_decode import DecodeScheduler
from .scheduler_prefill import PrefillScheduler
from .serving_chat import OpenAIServingChat
from .serving_completions import OpenAIServingCompletion
from .tokenizer_manager import TokenizerManager

# Where the scheduler's exceptions are raised, for the traceback line SGLang logs.
CONN_FRAME = '"sglang/srt/disaggregation/common/conn.py", in try_ensure_parallel_info'
LOADER_FRAME = '"sglang/srt/model_loader/loader.py", in _prepare_weights'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SimServer:
    def __init__(self, cfg: SimConfig, log: logging.Logger) -> None:
        self.cfg = cfg
        self.log = log
        metrics_class = SimMetrics if cfg.args.enable_metrics else NoMetrics
        self.metrics = metrics_class(cfg.served_model_name, cfg.mode)
        # tokenizer_manager.server_status and gracefully_exit in one: starting, up,
        # unhealthy (a /health that timed out; the next one that passes sets it up again),
        # stopping (SIGTERM).
        self.status = "starting"
        # The health check had failed when SIGTERM came (server_status UnHealthy): the drain
        # then ends at once.
        self.unhealthy_at_sigterm = False
        # The schedulers and detokenizer `python -m pdctl.sim` forked (none in-process).
        self.tree: Tree | None = None
        # The nixl backend's agent comes up first: a missing package or a UCX variable the
        # library refuses ends the start-up with one line (SystemExit), never a fallback.
        self.nixl = NixlKV(cfg.kv_slot_bytes, os.environ, log) if cfg.uses_nixl else None
        self.boot: BootstrapServer | None = None
        self.http: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()
        self.graph_gib = 0.0  # decode CUDA graphs captured at startup (none on a prefill)
        self.engine: Scheduler
        self.decode_engine: DecodeScheduler | None = None
        prefill_leg: PrefillLeg | None = None
        if cfg.mode is DisaggregationMode.PREFILL:
            prefill = PrefillScheduler(cfg, self.metrics, log)
            self.engine = prefill
            self.boot = BootstrapServer(
                prefill.clock,
                log,
                cfg.degraded_enabled,
                cfg.knobs.bootstrap_timeout_s + cfg.knobs.waiting_timeout_s,
                self.nixl,
            )
            prefill_leg = PrefillLeg(cfg, prefill, self.boot, self.metrics, log, self._kv_sender())
        elif cfg.mode is DisaggregationMode.DECODE:
            self.engine = self.decode_engine = DecodeScheduler(cfg, self.metrics, log)
        else:
            self.engine = Scheduler(cfg, self.metrics, log)
        self.tm = TokenizerManager(cfg, log, self.engine, self.metrics, self.spawn)
        self.tm.prefill_leg = prefill_leg
        info = InfoRoutes(self)
        # HTTP metrics are recorded with --enable-metrics only.
        middlewares = [self._http_metrics] if cfg.args.enable_metrics else []
        self.app = web.Application(middlewares=middlewares, client_max_size=64 * 2**20)
        r = self.app.router
        r.add_get("/health", info.health)
        r.add_get("/health_generate", info.health)
        control = ControlRoutes(self)
        r.add_get("/ready", control.ready)
        r.add_get("/ping", control.ping)
        r.add_post("/pause_generation", control.pause_generation)
        r.add_post("/continue_generation", control.continue_generation)
        r.add_get("/server_info", info.server_info)
        r.add_get("/get_server_info", info.server_info)
        r.add_get("/model_info", info.model_info)
        r.add_get("/get_model_info", info.model_info)
        r.add_get("/v1/models", info.models)
        r.add_route("*", "/flush_cache", info.flush_cache)
        r.add_get("/v1/loads", info.loads)
        generate = NativeGenerate(self.tm).handle
        r.add_post("/generate", generate)
        r.add_put("/generate", generate)
        r.add_post("/v1/completions", OpenAIServingCompletion(self.tm).handle)
        r.add_post("/v1/chat/completions", OpenAIServingChat(self.tm).handle)
        if cfg.args.enable_metrics:
            r.add_get("/metrics", info.metrics_endpoint)

    def _kv_sender(self) -> KVSender:
        if self.nixl is not None:
            return NixlKVSender(self.nixl, self.cfg, self.log)
        return HttpKVSender(self.cfg, self.engine.clock)

    def _kv_receiver(self) -> KVReceiver:
        if self.nixl is not None:
            return NixlKVReceiver(self.nixl, self.spawn)
        return HttpKVReceiver()

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
        if self.decode_engine is not None:
            self.tm.decode_leg = DecodeLeg(
                self.cfg,
                self.decode_engine,
                self.metrics,
                self.log,
                self.http,
                self.spawn,
                self._kv_receiver(),
                self.crash,
            )
        startup = await self._load_and_capture()
        self.spawn(self.engine.run())
        self.engine.publish_static_metrics(startup)
        if self.boot is not None:
            await self._register_prefill_rank()
        self.status = "up"
        self.log.info("The server is fired up and ready to roll!")

    async def _load_and_capture(self) -> Startup:
        """SGLang's startup lines (model_runner.py, cuda_graph_setup.py, scheduler.py) over
        PDSIM_STARTUP_DELAY_S: 60% loading weights, 40% capturing decode graphs (a prefill
        server captures none: cuda_graph_hook disables them for its role); what they
        measured, for emit_constants and emit_startup_time."""
        cfg, k, clock = self.cfg, self.cfg.knobs, self.engine.clock
        avail = k.gpu_mem_gib - 0.5
        self.log.info("Load weight begin. avail mem=%.2f GB", avail)
        await asyncio.to_thread(self._read_weights)
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
        capture_s: dict[str, float] = {}
        graph_gb: dict[str, float] = {}
        if cfg.mode is not DisaggregationMode.PREFILL:
            self.log.info(
                "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                "avail mem=%.2f GB",
                avail,
            )
            await clock.sleep(0.4 * k.startup_delay_s)
            graph_gib = min(max(avail - 0.5, 0.0), 0.5 + 0.02 * max(cfg.decode_buckets))
            self.graph_gib = graph_gib
            capture_s["decode"], graph_gb["decode"] = 0.4 * k.startup_delay_s, graph_gib
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
        return Startup(
            pool_tokens=cfg.kv_pool_tokens,
            page_size=cfg.page_size,
            context_len=cfg.context_length,
            weights_gb=k.weights_gib,
            kv_gb=cfg.kv_pool_tokens * k.kv_bytes_per_token / GIB,
            load_weight_s=0.6 * k.startup_delay_s,
            cuda_graph_s=capture_s,
            graph_gb=graph_gb,
            available_gb=avail,
            total_s=0.6 * k.startup_delay_s + sum(capture_s.values()),
        )

    async def _register_prefill_rank(self) -> None:
        a = self.cfg.args
        payload = registration(self.cfg)
        assert self.http is not None
        url = f"http://{a.host}:{a.disaggregation_bootstrap_port}/route"
        async with self.http.put(url, json=payload) as resp:
            resp.raise_for_status()

    def _read_weights(self) -> None:
        """The model directory's safetensors headers (pdctl.model.weights.load, as SGLang's
        DefaultModelLoader._prepare_weights and safe_open check them); a missing shard or a
        corrupt file fails the start-up where SGLang's scheduler would. No directory or no
        *.safetensors in it: no weights, as the sim always ran (docs/sim.md)."""
        path = self.cfg.args.model_path
        try:
            found = weights.load(path)
        except weights.WeightsError as e:
            self.crash(str(e), LOADER_FRAME)
        if found is None:
            self.log.info("No safetensors weights in %s: running without weights", path)
            return
        self.log.info(
            "Loading safetensors checkpoint shards: 100%% Completed | %d/%d (%d tensors, %.2f GB)",
            len(found.files),
            len(found.files),
            found.tensors,
            found.bytes / 1e9,
        )

    def crash(self, error: str, frame: str = CONN_FRAME) -> NoReturn:
        """An exception out of the scheduler (`error`: its type and message; `frame`: where
        it was raised): run_scheduler_process logs it and sends SIGQUIT to the HTTP server."""
        self.log.error(
            "Scheduler hit an exception: Traceback (most recent call last):\n  File %s\n%s",
            frame,
            error,
        )
        self.sigquit()

    def sigquit(self) -> NoReturn:
        """The SIGQUIT a failed child sends (tokenizer_manager.py
        running_phase_sigquit_handler): kill the process tree, children first, itself last
        with SIGKILL (utils/common.py kill_process_tree). In-flight requests get no answer;
        systemd sees status=9/KILL."""
        pid = os.getpid()
        self.log.error(
            "SIGQUIT received. signum=%d, frame=None. It usually means one child failed.",
            signal.SIGQUIT,
        )
        self.log.info("kill_process_tree called: parent_pid=%d, include_parent=True, pid=%d",
                      pid, pid)  # fmt: skip
        for child in self.tree.children if self.tree is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        logging.shutdown()
        os.kill(pid, signal.SIGKILL)
        os._exit(0)  # kill_process_tree's sys.exit(0), never reached

    async def watch_children(self) -> None:
        """utils/watchdog.py SubprocessWatchdog: a child that ended with a non-zero status
        (a SIGTERM sent to the whole cgroup kills the schedulers at once) takes the engine
        down through SIGQUIT within a second; the drain stops this watch first."""
        assert self.tree is not None
        while (crashed := self.tree.crashed()) is None:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
        self.log.error(
            "Subprocess %s (pid=%d) crashed with exit code %d. Triggering SIGQUIT for cleanup...",
            crashed.watch_name,
            crashed.pid,
            crashed.status,
        )
        self.sigquit()

    def sigterm(self) -> None:
        """tokenizer_manager.py SignalHandler.sigterm_handler: mark the engine as exiting
        (/health, /ready and /ping answer 503 from now on); requests, new ones included, are
        still served. Before start-up ends no handler is installed yet (SGLang starts its
        HTTP server only once the schedulers are ready): SIGTERM's default action."""
        if self.status == "starting":
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self.log.warning(
            "SIGTERM received. signum=%d frame=None. Draining requests and shutting down...",
            signal.SIGTERM,
        )
        self.unhealthy_at_sigterm = self.status == "unhealthy"
        self.status = "stopping"

    async def sigterm_watchdog(self) -> None:
        """tokenizer_manager.py sigterm_watchdog: look for the SIGTERM every 5 s (from the
        engine's start, so the drain begins 0-5 s after the signal), then every 5 s until no
        request is left (without a bound: the unit's TimeoutStopSec is the only one), unless
        the health check had failed or SGL_FORCE_SHUTDOWN is set; then the ShutdownReq, the
        wait for the schedulers and SIGKILL of the other children (procs.Tree.shutdown).
        Returns when the engine should exit (0, as 0.5.20 and later do)."""
        clock, every = self.engine.clock, self.cfg.knobs.drain_check_s
        while self.status != "stopping":
            await clock.sleep(every)
        while True:
            if self.unhealthy_at_sigterm:
                self.log.error("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if self.cfg.knobs.force_shutdown:
                self.log.error(
                    "Signal SIGTERM received while force shutdown flag set. Force exiting."
                )
                break
            rids = [req.rid for req in self.tm.inflight]
            self.log.info(
                "Gracefully exiting... Remaining number of requests %d. "
                "Remaining requests remaining_rids=%r.",
                len(rids),
                rids,
            )
            if not rids:
                break
            await clock.sleep(every)
        if self.tree is not None:
            self.tree.shutdown(self.log)

    async def shutdown(self) -> None:
        """The HTTP server's end (after the drain, or an in-process server's teardown): the
        requests still held end with an abort."""
        self.status = "stopping"
        for req in list(self.tm.inflight):
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
