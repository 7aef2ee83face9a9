"""The decode leg of a PD request and the decode's view of its prefills (SGLang's
`disaggregation/decode.py`).

Learn the prefill from bootstrap_host/port (GET /route, 15 tries 1 s apart, as decode.py's
_ensure_prefill_info) and hold its published layout against this decode's (handshake.py: a
mismatch try_ensure_parallel_info raises kills the decode; one CommonKVReceiver.init records
fails each request's handshake), register this process's session (the receiver's: on nixl
its agent name and KV args) once per prefill, as SGLang caches it per bootstrap address until the
heartbeat drops that prefill, preallocate KV, bootstrap the room, then long-poll the prefill
for the room's state (bounded by SGLANG_DISAGGREGATION_WAITING_TIMEOUT; on nixl the room is
admitted once its NIXL notification arrived) and decode. Each known prefill is heartbeaten on
its bootstrap `/health`; after the allowed failures it is dropped and its waiting rooms fail
with "Lost connection with prefill instance".

Cross-group accounting: a decode told its own prefills (PDSIM_PAIR_PARTNER=host:port[,...]: its
pair's or its group's) counts every request whose bootstrap address names another one
(`pdsim_cross_group_transfers_total`).

Degraded pair (PDSIM_DEGRADED=on, a modelled failure): a decode that sees its prefill answer
with a new start id keeps stale metadata, and PDSIM_DEGRADED_FAIL_RATIO of its rooms fail or
hang until both sides restart (docs/sim.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp

from .args import SimConfig
from .conn import KVPoll, KVReceiver
from .handshake import receiver_init_failure, scheduler_crash, tp_differs_warning
from .metrics import SimMetrics
from .pd_failures import degraded_draw, fail_transfer
from .req import Req
from .scheduler_decode import DecodeScheduler

ROUTE_TRIES = 15  # decode.py: _max_ensure_retries
ROUTE_RETRY_S = 1.0  # decode.py: _ensure_retry_interval
POLL_WAIT_S = 2.0
ABORT_ACK_S = 0.05  # a live prefill's AbortAck for a failed room: one round trip

RoomResult = tuple[KVPoll, str]  # a concluded room poll: (state, failure reason)


class PeerUnavailable(Exception):
    """The prefill cannot be used for this request; str() is the reason."""


@dataclass(eq=False)
class Peer:
    addr: str
    start_id: str
    degraded: bool
    info: Mapping[str, object]  # its published layout (PrefillServerInfo)
    rooms: set[int] = field(default_factory=set)
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class DecodeLeg:
    def __init__(
        self,
        cfg: SimConfig,
        engine: DecodeScheduler,
        metrics: SimMetrics,
        log: logging.Logger,
        http: aiohttp.ClientSession,
        spawn: Callable[[Awaitable[Any]], object],
        receiver: KVReceiver,
        crash: Callable[[str], NoReturn],
    ) -> None:
        self.cfg, self.engine, self.metrics, self.log, self.http = cfg, engine, metrics, log, http
        self.spawn = spawn  # background tasks the server cancels on shutdown
        self.crash = crash  # the scheduler's exception: ends the process (SimServer.crash)
        self.warned_tp = False  # _resolve_rank_mapping's warning_once
        self.receiver = receiver
        self.session_id = receiver.session_id
        self.decode_addr = f"{cfg.args.host}:{cfg.args.port}"
        self.peers: dict[str, Peer] = {}
        # Start ids of prefills seen before, kept after a peer is dropped (stale metadata).
        self.seen_start_ids: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # With a configured partner the counter is exposed from the start (0 is a result);
        # without one it stays absent, so nobody reads "no cross-group transfers" by mistake.
        self.partners = cfg.knobs.pair_partners
        if self.partners:
            metrics.sched_inc(metrics.cross_group_transfers, 0)

    def health(self, req: Req) -> None:
        """FakeKVReceiver: no peer, no KV; the single token comes out at once."""
        self.engine.start_transfer(req)
        self.engine.start_decoding(req)

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

    async def _ensure_peer(self, addr: str) -> Peer:
        """The cached peer, else a new one registered with; raises PeerUnavailable."""
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            peer = self.peers.get(addr)
            if peer is not None:
                return peer
            info = await self._fetch_route(addr)
            if info is None:
                raise PeerUnavailable("Aborted by AbortReq.")
            self._check_layout(info)
            try:
                async with self.http.put(
                    f"http://{addr}/pdsim/register",
                    json=self._registration(),
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as resp:
                    start_id = str((await resp.json())["start_id"])
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as e:
                raise PeerUnavailable("Aborted by AbortReq.") from e
            peer = Peer(addr, start_id, degraded=self._stale(addr, start_id), info=info)
            self.spawn(self._heartbeat(peer))
            self.peers[addr] = peer
            return peer

    def _check_layout(self, info: Mapping[str, object]) -> None:
        """try_ensure_parallel_info on a prefill's first fetched layout: what it raises ends
        the decode; its warning is logged once."""
        error = scheduler_crash(info, self.cfg)
        if error is not None:
            self.crash(error)
        warning = tp_differs_warning(info, self.cfg)
        if warning is not None and not self.warned_tp:
            self.warned_tp = True
            self.log.warning(warning)

    def _init_receiver(self, peer: Peer) -> None:
        """CommonKVReceiver.init: a request to a prefill whose published layout this decode
        refuses fails its handshake; raises PeerUnavailable."""
        reason = receiver_init_failure(peer.info, self.cfg)
        if reason is not None:
            raise PeerUnavailable(reason)

    def _registration(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "decode_addr": self.decode_addr,
            **self.receiver.registration(),
        }

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
        if self.partners and addr not in self.partners:
            m.sched_inc(m.cross_group_transfers)
        try:
            peer = await self._ensure_peer(addr)
            self._init_receiver(peer)
        except PeerUnavailable as e:
            m.rank_inc(m.num_bootstrap_failed_reqs)
            self._abort(req, "handshake", str(e))
            return
        t_boot = clock.now()
        await self.engine.preallocate(req)
        if req.done:
            return
        # set_decode_transfer_queue_entry_time: bootstrap, then wait for KV space
        m.rank_observe(m.kv_transfer_bootstrap_ms, (t_boot - t0) * 1000)
        m.rank_observe(m.kv_transfer_alloc_ms, (clock.now() - t_boot) * 1000)
        self.engine.start_transfer(req)
        peer.rooms.add(req.room)
        try:
            state, reason = await self._transfer(req, peer, t0)
        finally:
            peer.rooms.discard(req.room)
            self.receiver.forget(req.room)
        if req.done:
            return
        if state is KVPoll.Success:
            m.rank_observe(m.per_stage_req_latency, clock.now() - t0, stage="decode_transferred")
            self.engine.start_decoding(req)
            return
        m.rank_inc(m.num_transfer_failed_reqs)
        held = self.engine.defer_release(req)  # before the abort would free the slots
        self._abort(req, "transfer", reason)
        if held:
            self.spawn(self._resolve_deferred(req, peer, held))

    async def _resolve_deferred(self, req: Req, peer: Peer, held: int) -> None:
        """resolve_deferred_releases: a live prefill acks the abort ("drained"); a lost one
        never does, so the slots stay held until the timeout ("timeout", with SGLang's
        warning)."""
        clock, k = self.engine.clock, self.cfg.knobs
        t0 = clock.now()
        if peer.lost.is_set():
            await clock.sleep(k.deferred_kv_release_timeout_s)
            self.log.warning(
                "Deferred KV release for room %s timed out after %ss without a full drain "
                "ack from prefill; releasing anyway.",
                req.room,
                k.deferred_kv_release_timeout_s,
            )
            outcome = "timeout"
        else:
            await clock.sleep(ABORT_ACK_S)
            outcome = "drained"
        self.engine.release_deferred(req, held, clock.now() - t0, outcome)

    async def _transfer(self, req: Req, peer: Peer, t0: float) -> RoomResult:
        """Bootstrap the room and wait for its KV."""
        clock, k, m = self.engine.clock, self.cfg.knobs, self.metrics
        lost = (
            KVPoll.Failed,
            f"Lost connection with prefill instance (bootstrap_addr: {peer.addr})",
        )
        arrived = self.receiver.expect(req.room or 0)
        start_id = await self._bootstrap_room(peer.addr, req.room or 0)
        if start_id is not None:
            if start_id != peer.start_id and self._stale(peer.addr, start_id):
                peer.degraded = True
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
            if not k.degraded_hangs:
                return (
                    KVPoll.Failed,
                    "Failed to receive KV: stale prefill metadata (peer restarted alone)",
                )
            hang = True
        if hang:
            await self._wait_lost_or(peer, clock.sleep(k.waiting_timeout_s))
            return lost if peer.lost.is_set() else self._waiting_timeout(req, t1)
        while clock.now() - t1 < k.waiting_timeout_s and not req.done:
            wait = min(POLL_WAIT_S, k.waiting_timeout_s - (clock.now() - t1))
            result = await self._wait_lost_or(peer, self._poll(peer.addr, req.room or 0, wait))
            if peer.lost.is_set():
                return lost
            if result is not None and result[0].concluded:
                if result[0] is KVPoll.Success and arrived is not None:
                    # Admit once the WRITE's notification for the room is here.
                    left = k.waiting_timeout_s - (clock.now() - t1)
                    await self._wait_lost_or(peer, self._arrival(arrived, left))
                    if peer.lost.is_set():
                        return lost
                    if not arrived.is_set():
                        return self._waiting_timeout(req, t1)
                m.rank_observe(m.per_stage_req_latency, clock.now() - t1, stage="decode_waiting")
                return result
            if result is None:
                await clock.sleep(0.1)  # bootstrap server unreachable; the heartbeat decides
        return self._waiting_timeout(req, t1)

    async def _arrival(self, arrived: asyncio.Event, wait: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), self.engine.clock.wall(max(wait, 0.0)))

    async def _bootstrap_room(self, addr: str, room: int) -> str | None:
        """Send the room's KV indices to the prefill; its start id, None if unreachable."""
        body = {"session_id": self.session_id, **self.receiver.room_indices(room)}
        try:
            async with self.http.post(
                f"http://{addr}/pdsim/rooms/{room}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as resp:
                return str((await resp.json())["start_id"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return None

    def _waiting_timeout(self, req: Req, t1: float) -> RoomResult:
        elapsed = self.engine.clock.now() - t1
        return (
            KVPoll.Failed,
            f"Request {req.room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput",
        )

    async def _wait_lost_or(self, peer: Peer, aw: Awaitable[Any]) -> RoomResult | None:
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

    async def _poll(self, addr: str, room: int, wait: float) -> RoomResult | None:
        try:
            async with await self._get(
                f"http://{addr}/pdsim/rooms/{room}?wait={wait}",
                self.engine.clock.wall(wait) + 5,
            ) as resp:
                data = await resp.json()
                return KVPoll.from_wire(str(data["state"])), str(data.get("reason", ""))
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return None
