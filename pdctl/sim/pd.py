"""The two legs of a PD request and the decode's view of its prefills.

Prefill leg (prefill server): the room waits in the bootstrap queue until its decode
bootstraps it (bounded by SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), is prefilled, then its
KV transfers and the room turns ready; the leg answers with the first token. On the nixl
backend the transfer is a real NIXL WRITE into the decode's registered pool (nixl_conn.py); a
room whose decode agent the prefill's peer table lacks fails as SGLang's transfer worker
fails it ("KV transfer failed"), and a WRITE that fails fails the room with NIXL's text. On
other backends the transfer is a sleep at KV_TRANSFER_GB_S.

Decode leg (decode server): learn the prefill from bootstrap_host/port (GET /route, 15
tries 1 s apart, as decode.py's _ensure_prefill_info), register this process's session
(on nixl: its agent name and KV args) once per prefill, as SGLang caches it per bootstrap
address until the heartbeat drops that prefill, preallocate KV, bootstrap the room, then
long-poll the prefill for the room's state (bounded by SGLANG_DISAGGREGATION_WAITING_TIMEOUT;
on nixl the room is admitted once its NIXL notification arrived) and decode. Each known
prefill is heartbeaten on its bootstrap `/health`; after the allowed failures it is dropped
and its waiting rooms fail with "Lost connection with prefill instance".

Cross-pair accounting: a decode told its own prefill (PDSIM_PAIR_PARTNER=host:port) counts
every request whose bootstrap address names another one (`pdsim_cross_pair_transfers_total`).

Degraded pair (PDSIM_DEGRADED=on, a modelled failure): a survivor that sees its peer's
identity change (a decode re-registering with a new session, a prefill answering with a new
start id) keeps stale metadata, and PDSIM_DEGRADED_FAIL_RATIO of its rooms fail or hang until
both sides restart. Real NIXL over host memory shows no such failure (docs/sim.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import aiohttp

from .args import SimConfig
from .bootstrap import FAILED, PENDING, READY, BootstrapServer, Room
from .engine import Engine, Req
from .metrics import SimMetrics
from .nixl_conn import NixlKV, TransferError

ROUTE_TRIES = 15  # decode.py: _max_ensure_retries
ROUTE_RETRY_S = 1.0  # decode.py: _ensure_retry_interval
KV_TRANSFER_GB_S = 20.0  # simulated link speed (same-host PCIe, UCX)
POLL_WAIT_S = 2.0


def observe_transfer(m: SimMetrics, total_bytes: int, seconds: float) -> None:
    """req_time_stats.compute_and_observe_kv_transfer_metrics: MiB and GiB/s."""
    if seconds <= 0:
        return
    mb = total_bytes / 2**20
    m.rank_observe(m.kv_transfer_latency_ms, seconds * 1000)
    m.rank_observe(m.kv_transfer_speed_gb_s, mb / 1024 / seconds)
    m.rank_observe(m.kv_transfer_total_mb, mb)


def fail_transfer(
    engine: Engine, log: logging.Logger, req: Req, what: str, var: str, reason: str
) -> None:
    """Log SGLang's KV-transfer failure line for `what` ("Prefill bootstrap", ...) and abort
    the request with it (500); `var` is the request's name in that scheduler's f-string."""
    message = (
        f"{what} failed for request rank=0 {var}.rid={req.rid!r} "
        f"{var}.bootstrap_room={req.room} with exception "
        f"KVTransferError(bootstrap_room={req.room}): {reason}"
    )
    log.error(message)
    engine.abort(req, message, HTTPStatus.INTERNAL_SERVER_ERROR)


def degraded_draw(seed: int, room: int, ratio: float) -> bool:
    """Whether a degraded pair fails this room; deterministic per (seed, room)."""
    return random.Random(f"degraded:{seed}:{room}").random() < ratio


# ----------------------------------------------------------------------------------
# Prefill side
# ----------------------------------------------------------------------------------
class PrefillLeg:
    def __init__(
        self,
        cfg: SimConfig,
        engine: Engine,
        boot: BootstrapServer,
        metrics: SimMetrics | None,
        log: logging.Logger,
        nixl: NixlKV | None = None,
    ) -> None:
        self.cfg, self.engine, self.boot, self.metrics, self.log = cfg, engine, boot, metrics, log
        self.nixl = nixl

    def _fail(self, req: Req, phase: str, reason: str) -> None:
        fail_transfer(self.engine, self.log, req, f"Prefill {phase}", "req", reason)

    async def run(self, req: Req) -> None:
        assert req.room is not None
        clock, k, m = self.engine.clock, self.cfg.knobs, self.metrics
        room = self.boot.room(req.room)
        self.engine.bootstrap_queue.add(req)
        t0 = clock.now()
        try:
            await asyncio.wait_for(room.bootstrapped.wait(), clock.wall(k.bootstrap_timeout_s))
        except TimeoutError:
            elapsed = clock.now() - t0
            reason = f"Request {req.room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            room.conclude(FAILED, reason)
            if m:
                m.rank_inc(m.num_bootstrap_failed_reqs)
            self._fail(req, "bootstrap", reason)
            return
        finally:
            self.engine.bootstrap_queue.discard(req)
        bootstrap_ms = (clock.now() - t0) * 1000
        if m:
            m.rank_observe(m.per_stage_req_latency, clock.now() - t0, stage="prefill_bootstrap")
        if req.done:  # the client went away while the room bootstrapped
            room.conclude(FAILED, "Aborted by AbortReq.")
            return
        self.engine.submit_prefill(req)
        await req.prefilled.wait()
        if req.done:  # aborted or cancelled while queued
            room.conclude(FAILED, "Aborted by AbortReq.")
            return
        t1 = clock.now()
        if self.nixl is not None:
            moved = await self._nixl_write(req, room)
            if moved is None:
                return
            total_bytes, transfer_s = moved
        else:
            total_bytes = req.prompt_tokens * k.kv_bytes_per_token
            transfer_s = total_bytes / 1e9 / KV_TRANSFER_GB_S
            await clock.sleep(transfer_s)
        if self.boot.is_degraded(room) and degraded_draw(k.seed, req.room, k.degraded_fail_ratio):
            if k.degraded_mode == "hang":
                # The KV never arrives; the decode's waiting timeout ends the request.
                await self._hang(req, t0)
                return
            reason = "Failed to transfer KV: stale decode metadata (peer restarted alone)"
            room.conclude(FAILED, reason)
            if m:
                m.rank_inc(m.num_transfer_failed_reqs)
            self._fail(req, "transfer", reason)
            return
        room.conclude(READY)
        if m:
            m.rank_observe(
                m.per_stage_req_latency, clock.now() - t1, stage="prefill_transfer_kv_cache"
            )
            observe_transfer(m, total_bytes, transfer_s)
            # compute_and_observe_kv_transfer_metrics: bootstrap and alloc with the transfer;
            # the sim's prefill allocates as soon as the room bootstraps.
            m.rank_observe(m.kv_transfer_bootstrap_ms, bootstrap_ms)
            m.rank_observe(m.kv_transfer_alloc_ms, 0.0)
        self.engine.complete_prefill(req)

    async def _nixl_write(self, req: Req, room: Room) -> tuple[int, float] | None:
        """The room's KV through NIXL: (bytes, seconds), None when the room failed."""
        assert self.nixl is not None and req.room is not None
        k, m = self.cfg.knobs, self.metrics
        peer = room.session_id or ""
        if peer not in self.nixl.peers:
            # transfer_worker asserts the agent is registered; conclude_failure has no
            # text for the AssertionError and reports its default.
            self.log.error("Unexpected transfer worker error for room %s", req.room)
            reason = "KV transfer failed"
        else:
            nbytes = max(int(req.prompt_tokens * k.kv_bytes_per_token * k.kv_transfer_scale), 1)
            try:
                seconds = await self.nixl.write(peer, nbytes, room.dst_offset, req.room)
                return nbytes, seconds
            except TransferError as e:
                self.log.warning("NIXL transport error for room %s: %s", req.room, e)
                reason = str(e)
        room.conclude(FAILED, reason)
        if m:
            m.rank_inc(m.num_transfer_failed_reqs)
        self._fail(req, "transfer", reason)
        return None

    async def _hang(self, req: Req, t0: float) -> None:
        clock = self.engine.clock
        remaining = self.cfg.knobs.bootstrap_timeout_s - (clock.now() - t0)
        await clock.sleep(remaining)
        reason = (
            f"Request {req.room} timed out after {clock.now() - t0:.1f}s in KVPoll.Transferring"
        )
        self.boot.room(req.room or 0).conclude(FAILED, reason)
        self._fail(req, "transfer", reason)


# ----------------------------------------------------------------------------------
# Decode side
# ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Peer:
    addr: str
    start_id: str
    degraded: bool
    rooms: set[int] = field(default_factory=set)
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class DecodeLeg:
    def __init__(
        self,
        cfg: SimConfig,
        engine: Engine,
        metrics: SimMetrics | None,
        log: logging.Logger,
        http: aiohttp.ClientSession,
        spawn: Callable[[Awaitable[Any]], object],
        nixl: NixlKV | None = None,
    ) -> None:
        self.cfg, self.engine, self.metrics, self.log, self.http = cfg, engine, metrics, log, http
        self.spawn = spawn  # background tasks the server cancels on shutdown
        self.nixl = nixl
        self.session_id = nixl.name if nixl else uuid.uuid4().hex
        if nixl:
            spawn(nixl.pump_notifications())
        self.decode_addr = f"{cfg.args.host}:{cfg.args.port}"
        self.peers: dict[str, Peer] = {}
        # Start ids of prefills seen before, kept after a peer is dropped (stale metadata).
        self.seen_start_ids: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # With a configured partner the counter is exposed from the start (0 is a result);
        # without one it stays absent, so nobody reads "no cross-pair transfers" by mistake.
        self.partner = cfg.knobs.pair_partner
        if self.partner and metrics:
            metrics.sched_inc(metrics.cross_pair_transfers, 0)

    def _abort(self, req: Req, phase: str, reason: str) -> None:
        fail_transfer(self.engine, self.log, req, f"Decode {phase}", "decode_req.req", reason)

    async def _get(self, url: str, timeout: float) -> aiohttp.ClientResponse:
        return await self.http.get(url, timeout=aiohttp.ClientTimeout(total=timeout))

    async def _fetch_route(self, addr: str) -> dict[str, object] | None:
        url = (
            f"http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&"
            f"target_tp_rank=-1&target_pp_rank=-1"
        )
        for attempt in range(ROUTE_TRIES):
            if attempt:
                await self.engine.clock.sleep(ROUTE_RETRY_S)
            try:
                async with await self._get(url, 5) as resp:
                    if resp.status == 200:
                        data: dict[str, object] = await resp.json()
                        return data
                    self.log.error(
                        "Failed to get prefill server info: %s, %s", resp.status, await resp.text()
                    )
            except (aiohttp.ClientError, TimeoutError) as e:
                self.log.error("Error fetching prefill server info from bootstrap: %s", e)
        self.log.error(
            "Could not fetch prefill parallel info from %s after %d attempts", addr, ROUTE_TRIES
        )
        return None

    async def _ensure_peer(self, addr: str) -> Peer | str:
        """The cached peer, or a failure reason."""
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            peer = self.peers.get(addr)
            if peer is not None:
                return peer
            info = await self._fetch_route(addr)
            if info is None:
                return "Aborted by AbortReq."
            a = self.cfg.args
            if info.get("page_size") != self.cfg.page_size:
                return (
                    f"Page size mismatch: prefill server has page_size={info.get('page_size')}, "
                    f"but decode server has page_size={self.cfg.page_size}. "
                    "Both servers must use the same --page-size value."
                )
            if info.get("kv_cache_dtype") != a.kv_cache_dtype:
                return (
                    f"KV cache dtype mismatch: prefill server has kv_cache_dtype="
                    f"{info.get('kv_cache_dtype')}, but decode server has kv_cache_dtype="
                    f"{a.kv_cache_dtype}. Both servers must use the same --kv-cache-dtype value."
                )
            try:
                async with self.http.put(
                    f"http://{addr}/pdsim/register",
                    json=self._registration(),
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as resp:
                    start_id = str((await resp.json())["start_id"])
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
                return "Aborted by AbortReq."
            peer = Peer(addr, start_id, degraded=self._stale(addr, start_id))
            self.spawn(self._heartbeat(peer))
            self.peers[addr] = peer
            return peer

    def _registration(self) -> dict[str, object]:
        body: dict[str, object] = {"session_id": self.session_id, "decode_addr": self.decode_addr}
        if self.nixl:
            body["kv_args"] = self.nixl.info().to_json()
        return body

    def _stale(self, addr: str, start_id: str) -> bool:
        seen = self.seen_start_ids.setdefault(addr, start_id)
        if seen != start_id and self.cfg.degraded_enabled:
            self.log.warning(
                "Prefill %s restarted while this decode kept its old metadata: the pair "
                "is degraded until both sides restart",
                addr,
            )
            return True
        return False

    async def _heartbeat(self, peer: Peer) -> None:
        k = self.cfg.knobs
        failures = 0
        while True:
            await self.engine.clock.sleep(k.heartbeat_interval_s)
            try:
                async with await self._get(f"http://{peer.addr}/health", 3) as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                failures = 0
                continue
            self.log.info("Attempting to reconnect to %s...", peer.addr)
            failures += 1
            if failures >= k.heartbeat_max_failure:
                self.peers.pop(peer.addr, None)
                peer.lost.set()
                self.log.error(
                    "Lost connection with prefill instance (bootstrap_addr: %s), "
                    "%d requests affected",
                    peer.addr,
                    len(peer.rooms),
                )
                return

    async def run(self, req: Req, host: str, port: int) -> None:
        assert req.room is not None
        clock, m = self.engine.clock, self.metrics
        addr = f"{host}:{port}"
        t0 = clock.now()
        if m and self.partner and addr != self.partner:
            m.sched_inc(m.cross_pair_transfers)
        peer = await self._ensure_peer(addr)
        if isinstance(peer, str):
            if m:
                m.rank_inc(m.num_bootstrap_failed_reqs)
            self._abort(req, "handshake", peer)
            return
        t_boot = clock.now()
        await self.engine.preallocate(req)
        if req.done:
            return
        if m:  # set_decode_transfer_queue_entry_time: bootstrap, then wait for KV space
            m.rank_observe(m.kv_transfer_bootstrap_ms, (t_boot - t0) * 1000)
            m.rank_observe(m.kv_transfer_alloc_ms, (clock.now() - t_boot) * 1000)
        self.engine.transfer.add(req)
        peer.rooms.add(req.room)
        try:
            state, reason = await self._transfer(req, peer, t0)
        finally:
            peer.rooms.discard(req.room)
            if self.nixl:
                self.nixl.forget(req.room)
        if req.done:
            return
        if state == READY:
            if m:
                m.rank_observe(
                    m.per_stage_req_latency, clock.now() - t0, stage="decode_transferred"
                )
            self.engine.start_decoding(req)
            return
        if m:
            m.rank_inc(m.num_transfer_failed_reqs)
        self._abort(req, "transfer", reason)

    async def _transfer(self, req: Req, peer: Peer, t0: float) -> tuple[str, str]:
        """Bootstrap the room and wait for its KV: (state, failure reason)."""
        clock, k, m = self.engine.clock, self.cfg.knobs, self.metrics
        lost = (FAILED, f"Lost connection with prefill instance (bootstrap_addr: {peer.addr})")
        arrived = self.nixl.expect(req.room or 0) if self.nixl else None
        start_id = await self._bootstrap_room(peer.addr, req.room or 0)
        if start_id is not None:
            if start_id != peer.start_id and self._stale(peer.addr, start_id):
                peer.degraded = True
            if m:
                m.rank_observe(m.per_stage_req_latency, clock.now() - t0, stage="decode_bootstrap")
        t1 = clock.now()
        # A room the prefill never saw, or a degraded pair's hang: only the heartbeat or
        # the waiting timeout ends the wait.
        hang = start_id is None
        if (
            not hang
            and peer.degraded
            and degraded_draw(k.seed, req.room or 0, k.degraded_fail_ratio)
        ):
            if k.degraded_mode == "fail":
                return FAILED, "Failed to receive KV: stale prefill metadata (peer restarted alone)"
            hang = True
        if hang:
            await self._wait_lost_or(peer, clock.sleep(k.waiting_timeout_s))
            return lost if peer.lost.is_set() else self._waiting_timeout(req, t1)
        while clock.now() - t1 < k.waiting_timeout_s and not req.done:
            wait = min(POLL_WAIT_S, k.waiting_timeout_s - (clock.now() - t1))
            result = await self._wait_lost_or(peer, self._poll(peer.addr, req.room or 0, wait))
            if peer.lost.is_set():
                return lost
            if result is not None and result[0] != PENDING:
                if result[0] == READY and arrived is not None:
                    # Admit once the WRITE's notification for the room is here.
                    left = k.waiting_timeout_s - (clock.now() - t1)
                    await self._wait_lost_or(peer, self._arrival(arrived, left))
                    if peer.lost.is_set():
                        return lost
                    if not arrived.is_set():
                        return self._waiting_timeout(req, t1)
                if m:
                    m.rank_observe(
                        m.per_stage_req_latency, clock.now() - t1, stage="decode_waiting"
                    )
                return result
            if result is None:
                await clock.sleep(0.1)  # bootstrap server unreachable; the heartbeat decides
        return self._waiting_timeout(req, t1)

    async def _arrival(self, arrived: asyncio.Event, wait: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), self.engine.clock.wall(max(wait, 0.0)))

    async def _bootstrap_room(self, addr: str, room: int) -> str | None:
        """Send the room's KV indices to the prefill; its start id, None if unreachable."""
        body: dict[str, object] = {"session_id": self.session_id}
        if self.nixl:
            body["dst_offset"] = self.nixl.slot_offset(room)
        try:
            async with self.http.post(
                f"http://{addr}/pdsim/rooms/{room}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as resp:
                return str((await resp.json())["start_id"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return None

    def _waiting_timeout(self, req: Req, t1: float) -> tuple[str, str]:
        elapsed = self.engine.clock.now() - t1
        return (
            FAILED,
            f"Request {req.room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput",
        )

    async def _wait_lost_or(self, peer: Peer, aw: Awaitable[Any]) -> tuple[str, str] | None:
        """Await `aw` unless the heartbeat declares the peer lost first; a tuple result."""
        task = asyncio.ensure_future(aw)
        lost = asyncio.ensure_future(peer.lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not task.done():
            task.cancel()
            return None
        result = task.result()
        return result if isinstance(result, tuple) else None

    async def _poll(self, addr: str, room: int, wait: float) -> tuple[str, str] | None:
        try:
            async with await self._get(
                f"http://{addr}/pdsim/rooms/{room}?wait={wait}",
                self.engine.clock.wall(wait) + 5,
            ) as resp:
                data = await resp.json()
                return str(data["state"]), str(data.get("reason", ""))
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return None
