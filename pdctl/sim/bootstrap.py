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
  was transferred ("ready") or failed.
The handoff is pull-based: the decode asks the prefill for the room's KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from .model import Clock
from .nixl_conn import NixlKV, PeerInfo

PENDING, READY, FAILED = "pending", "ready", "failed"
ROOM_SWEEP_AT = 1024


@dataclass(eq=False)
class Room:
    room: int
    created: float
    session_id: str | None = None
    dst_offset: int = 0  # where the decode preallocated the room's KV in its NIXL pool
    state: str = PENDING
    reason: str = ""
    bootstrapped: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def conclude(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
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
        self.rooms.pop(room, None)

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
            self.info = {
                "attn_tp_size": data["attn_tp_size"],
                "attn_cp_size": data["attn_cp_size"],
                "dp_size": data["attn_dp_size"],
                "pp_size": data["pp_size"],
                "page_size": int(data["page_size"]),
                "kv_cache_dtype": data["kv_cache_dtype"],
                "follow_bootstrap_room": True,
                "enable_dsa_cache_layer_split": False,
                "enable_kv_cache_sharding": False,
                "prefill_http_port": data.get("prefill_http_port"),
                "decode_allocation_policy": "early",
            }
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
        r.session_id = str(data["session_id"])
        r.dst_offset = int(data.get("dst_offset", 0))
        r.bootstrapped.set()
        return web.json_response({"state": r.state, "start_id": self.start_id})

    async def _poll_room(self, request: web.Request) -> web.Response:
        room = int(request.match_info["room"])
        wait = float(request.query.get("wait", "0"))
        r = self.rooms.get(room)
        if r is None:
            return web.json_response(
                {"state": FAILED, "reason": "unknown room", "start_id": self.start_id}
            )
        if r.state == PENDING:
            r.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(r.changed.wait(), self.clock.wall(wait))
        if r.state != PENDING:
            self.drop(room)
        return web.json_response({"state": r.state, "reason": r.reason, "start_id": self.start_id})
