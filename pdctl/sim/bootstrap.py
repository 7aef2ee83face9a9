"""The prefill's bootstrap HTTP server (on --disaggregation-bootstrap-port, bound to --host).

SGLang's routes, as `disaggregation/common/conn.py` CommonKVBootstrapServer serves them:
`PUT /route` (a prefill rank registers), `GET /route` (400 without the four rank query
parameters, 503 until every rank registered, the PrefillServerInfo with all -1, else one
rank's address), `GET /health` -> "OK".

Sim-only routes stand in for SGLang's ZMQ side channel:
- `PUT /pdsim/register` {session_id, decode_addr[, kv_args]}: a decode process registers its
  KV buffers (one session id per decode process), answered with the prefill's start id. On
  the nixl backend the session id is the decode's NIXL agent name and `kv_args` its agent
  metadata and pool (nixl_conn.PeerInfo), added to the prefill's peer table.
- `POST /pdsim/rooms/{room}` {session_id[, dst_offset]}: the decode preallocated KV for the
  room and sent its indices ("bootstrapped"); answered with the room state and start id.
- `GET /pdsim/rooms/{room}?wait=S`: long-poll (S simulated seconds) until the room's KV
  was transferred ("ready") or failed. A room whose result was fetched answers the same
  result to a poll that comes again (its answer was lost or late).
A room goes through SGLang's sender states (KVPoll): Bootstrapping until its decode sent the
indices, WaitingForInput until it is prefilled, Transferring, then Success or Failed; the
poll's `state` is "pending" until one of the last two.
The handoff is pull-based: the decode asks the prefill for the room's KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .conn import KVPoll
from .model import Clock
from .nixl_conn import NixlKV, PeerInfo

ROOM_SWEEP_AT = 1024
# Fetched results kept for a poll that comes again, oldest forgotten first.
CONCLUDED_KEPT = 1024


def server_info(data: dict[str, Any]) -> dict[str, object]:
    """The PrefillServerInfo a decode reads (`GET /route` with every rank -1) from what the
    prefill's rank registered: CommonKVBootstrapServer's `PUT /route` and its answer; the
    decode checks it (handshake.py). kv_layout only where there is one."""
    return {
        "attn_tp_size": data["attn_tp_size"],
        "attn_cp_size": data["attn_cp_size"],
        "dp_size": data["attn_dp_size"],
        "pp_size": data["pp_size"],
        "page_size": int(data["page_size"]),
        "kv_cache_dtype": data["kv_cache_dtype"],
        "follow_bootstrap_room": True,
        "enable_dsa_cache_layer_split": bool(data.get("enable_dsa_cache_layer_split")),
        "enable_kv_cache_sharding": bool(data.get("enable_kv_cache_sharding")),
        "prefill_http_port": data.get("prefill_http_port"),
        "decode_allocation_policy": data.get("decode_allocation_policy", "early"),
        **({"kv_layout": data["kv_layout"]} if data.get("kv_layout") else {}),
    }


@dataclass(eq=False)
class Room:
    room: int
    created: float
    session_id: str | None = None
    dst_offset: int = 0  # where the decode preallocated the room's KV in its NIXL pool
    reason: str = ""
    bootstrapped: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Every state the room was in, in order (the last is its state).
    history: list[KVPoll] = field(default_factory=lambda: [KVPoll.Bootstrapping])

    @property
    def state(self) -> KVPoll:
        return self.history[-1]

    def _move(self, state: KVPoll) -> None:
        # A concluded room keeps its result for the decode's poll.
        if not self.state.concluded:
            self.history.append(state)

    def bootstrap(self, session_id: str, dst_offset: int) -> None:
        """The decode preallocated the room's KV and sent where it goes."""
        self.session_id, self.dst_offset = session_id, dst_offset
        if self.state is KVPoll.Bootstrapping:
            self._move(KVPoll.WaitingForInput)
        self.bootstrapped.set()

    def start_transfer(self) -> None:
        self._move(KVPoll.Transferring)

    def conclude(self, state: KVPoll, reason: str = "") -> None:
        self.history.append(state)
        self.reason = reason
        self.changed.set()


class BootstrapServer:
    def __init__(
        self,
        clock: Clock,
        log: logging.Logger,
        degraded_enabled: bool,
        room_ttl_s: float,
        nixl: NixlKV | None = None,
    ) -> None:
        self.clock = clock
        self.nixl = nixl
        # Rooms nobody polls (the decode died or gave up) are forgotten after this long.
        self.room_ttl_s = room_ttl_s
        self.log = log
        self.degraded_enabled = degraded_enabled
        self.start_id = uuid.uuid4().hex
        self.info: dict[str, object] | None = None
        self.rank: dict[str, object] | None = None
        self.rooms: dict[int, Room] = {}
        self.concluded: OrderedDict[int, Room] = OrderedDict()
        # decode_addr -> session id, and decode addrs whose session changed under us.
        self.sessions: dict[str, str] = {}
        self.session_addr: dict[str, str] = {}
        self.degraded_addrs: set[str] = set()
        self.app = web.Application()
        self.app.router.add_route("*", "/route", self._route)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_put("/pdsim/register", self._register)
        self.app.router.add_post("/pdsim/rooms/{room}", self._bootstrap_room)
        self.app.router.add_get("/pdsim/rooms/{room}", self._poll_room)

    # ----- rooms (used by the prefill leg) --------------------------------------------
    def room(self, room: int) -> Room:
        r = self.rooms.get(room)
        if r is None:
            if len(self.rooms) >= ROOM_SWEEP_AT:
                cutoff = self.clock.now() - self.room_ttl_s
                for stale in [k for k, v in self.rooms.items() if v.created < cutoff]:
                    del self.rooms[stale]
            r = self.rooms[room] = Room(room, self.clock.now())
        return r

    def drop(self, room: int) -> None:
        """The decode fetched the room's result: the room leaves the live ones, its result
        stays for a poll that comes again. A poll's answer can be lost or late (the decode's
        timeout on a loaded machine) and the decode then asks again; SGLang's decode holds the
        state its prefill pushed, so a lost answer cannot fail a request there."""
        r = self.rooms.pop(room, None)
        if r is not None:
            self.concluded[room] = r
            while len(self.concluded) > CONCLUDED_KEPT:
                self.concluded.popitem(last=False)

    def is_degraded(self, r: Room) -> bool:
        addr = self.session_addr.get(r.session_id or "")
        return addr in self.degraded_addrs

    # ----- SGLang routes --------------------------------------------------------------
    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="OK", status=200)

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            data = await request.json()
            self.rank = {"rank_ip": data["rank_ip"], "rank_port": int(data["rank_port"])}
            self.info = server_info(data)
            return web.Response(text="OK", status=200)
        if request.method != "GET":
            return web.Response(
                text="Method not allowed", status=405, content_type="application/json"
            )
        q = request.query
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(k) for k in keys):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        if self.info is None or self.rank is None:
            return web.Response(
                text="Prefill server not fully registered yet (0 workers registered).",
                status=503,
            )
        if all(int(q[k]) == -1 for k in keys):
            return web.json_response(self.info)
        if any(int(q[k]) != 0 for k in keys):
            return web.Response(
                text=f"Bootstrap info not found for dp_rank={q['prefill_dp_rank']} "
                f"cp_rank={q['prefill_cp_rank']} tp_rank={q['target_tp_rank']} "
                f"pp_rank={q['target_pp_rank']}",
                status=404,
            )
        return web.json_response(self.rank)

    # ----- sim side channel -----------------------------------------------------------
    async def _register(self, request: web.Request) -> web.Response:
        data = await request.json()
        addr, session = str(data["decode_addr"]), str(data["session_id"])
        if self.nixl is not None:
            if "kv_args" not in data:
                return web.Response(text="kv_args missing: is the decode on nixl?", status=400)
            self.nixl.add_peer(PeerInfo.from_json(data["kv_args"]))
        old = self.sessions.get(addr)
        if old is not None and old != session and self.degraded_enabled:
            # A decode at this address restarted while we kept running: we keep its old
            # buffers' metadata (the NIXL failure mode), so transfers to it go wrong.
            self.degraded_addrs.add(addr)
            self.log.warning(
                "Decode %s re-registered with a new session while this prefill kept its old "
                "metadata: the pair is degraded until both sides restart",
                addr,
            )
        self.sessions[addr] = session
        self.session_addr[session] = addr
        return web.json_response({"start_id": self.start_id})

    async def _bootstrap_room(self, request: web.Request) -> web.Response:
        data = await request.json()
        r = self.room(int(request.match_info["room"]))
        r.bootstrap(str(data["session_id"]), int(data.get("dst_offset", 0)))
        return web.json_response({"state": r.state.wire, "start_id": self.start_id})

    async def _poll_room(self, request: web.Request) -> web.Response:
        room = int(request.match_info["room"])
        wait = float(request.query.get("wait", "0"))
        r = self.rooms.get(room) or self.concluded.get(room)
        if r is None:
            return web.json_response(
                {"state": KVPoll.Failed.wire, "reason": "unknown room", "start_id": self.start_id}
            )
        if not r.state.concluded:
            r.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(r.changed.wait(), self.clock.wall(wait))
        if r.state.concluded:
            self.drop(room)
        return web.json_response(
            {"state": r.state.wire, "reason": r.reason, "start_id": self.start_id}
        )
