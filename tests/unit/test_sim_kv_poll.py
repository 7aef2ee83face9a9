"""A room's states on the prefill, as SGLang's KV sender reports them (KVPoll): Bootstrapping
until the decode sends the room's indices, WaitingForInput until the prefill forward,
Transferring, then Success or Failed; the decode's room poll sees "pending" until the room
concludes."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable

import aiohttp

from pdctl.sim.bootstrap import Room
from pdctl.sim.conn import KVPoll
from pdctl.sim.scheduler_prefill import PrefillScheduler
from pdctl.sim.server import SimServer
from pdctl.testing.stack import free_port, in_process, pd_generate

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}
GOOD = [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success]
ROOM = 7

Test = Callable[[SimServer, Room, aiohttp.ClientSession, str], Awaitable[None]]


def on_prefill(test: Test, env: dict[str, str] | None = None) -> None:
    """Run `test` against a prefill alone with the room ROOM made in advance (the legs then
    use that object), and its bootstrap server's URL."""

    async def main() -> None:
        port = free_port()
        async with (
            in_process("prefill", {**FAST, **(env or {})}, bootstrap_port=port) as p,
            aiohttp.ClientSession() as http,
        ):
            assert p.boot is not None
            await test(p, p.boot.room(ROOM), http, f"http://127.0.0.1:{port}")

    asyncio.run(asyncio.wait_for(main(), 30))


def leg_body(boot_url: str) -> dict[str, object]:
    port = int(boot_url.rsplit(":", 1)[1])
    return {"text": "hi", "bootstrap_port": port, "bootstrap_room": ROOM}


def test_a_good_transfer_goes_through_every_sender_state() -> None:
    async def main() -> None:
        port = free_port()
        async with (
            in_process("prefill", FAST, bootstrap_port=port) as p,
            in_process("decode", FAST) as d,
            aiohttp.ClientSession() as http,
        ):
            assert p.boot is not None
            room = p.boot.room(ROOM)
            (pstatus, _), (dstatus, _) = await pd_generate(http, p.url, d.url, port, ROOM)
            assert (pstatus, dstatus) == (200, 200)
            assert room.history == GOOD and room.reason == ""
            assert ROOM not in p.boot.rooms, "the decode's last poll drops a concluded room"
            # A poll that comes again (its answer was lost or late) gets the same result, not
            # "unknown room": a CI run once failed a request that way under load.
            async with http.get(f"http://127.0.0.1:{port}/pdsim/rooms/{ROOM}") as resp:
                assert await resp.json() == {
                    "state": "ready",
                    "reason": "",
                    "start_id": p.boot.start_id,
                }

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_room_fails_where_its_decode_never_bootstraps_it() -> None:
    async def t(p: SimServer, room: Room, http: aiohttp.ClientSession, boot: str) -> None:
        async with http.post(f"{p.url}/generate", json=leg_body(boot)) as resp:
            assert resp.status == 500
        assert room.history == [KVPoll.Bootstrapping, KVPoll.Failed]
        assert re.fullmatch(
            rf"Request {ROOM} timed out after [\d.]+s in KVPoll\.Bootstrapping", room.reason
        )
        async with http.get(f"{boot}/pdsim/rooms/{ROOM}") as resp:
            assert (await resp.json())["state"] == "failed"

    on_prefill(t, {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2"})


def test_a_room_whose_client_left_fails_once_bootstrapped() -> None:
    """The prefill's client went away while the room waited for its decode: the decode's
    bootstrap finds an aborted request, and the room fails without a transfer."""

    async def t(p: SimServer, room: Room, http: aiohttp.ClientSession, boot: str) -> None:
        engine = p.engine
        assert isinstance(engine, PrefillScheduler)
        leg = asyncio.create_task(http.post(f"{p.url}/generate", json=leg_body(boot)))
        while not engine.bootstrap_queue:
            await asyncio.sleep(0.01)
        leg.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leg
        while p.tm.inflight:  # the server saw the client leave
            await asyncio.sleep(0.01)
        async with http.post(f"{boot}/pdsim/rooms/{ROOM}", json={"session_id": "gone"}) as resp:
            assert (await resp.json())["state"] == "pending"
        while not room.state.concluded:
            await asyncio.sleep(0.01)
        assert room.history == [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Failed]
        assert room.reason == "Aborted by AbortReq."

    on_prefill(t)
