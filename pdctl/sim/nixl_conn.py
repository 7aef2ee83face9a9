"""The `nixl` backend's KV path through the real NIXL library (nixl-cu12, UCX backend, DRAM).

Follows sglang 0.5.23 `disaggregation/nixl/conn.py`: one agent per engine named by a fresh
uuid at each start; the decode registers its KV args (agent name, agent metadata, pool
address and size) with the prefill, which keeps them in a table keyed by agent name (a name
already registered is ignored); per room the prefill WRITEs the room's KV bytes into the
decode's registered pool, and reloads a peer's metadata NIXL invalidated after a failed
transfer. The sim attaches the room as the WRITE's notification and the decode admits the
request once it arrives (SGLang 0.5.23 reports the result over its ZMQ status message; the
sim's room poll carries that result, the notification proves the bytes landed).

The pool is host memory (`DRAM`) sized in slots of one full-context request, so a CPU-only
host moves real bytes over UCX (TCP or shared memory, as UCX_TLS allows). Bytes per room are
`kv_bytes_per_token x tokens x PDSIM_KV_TRANSFER_SCALE` (docs/sim.md).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .conn import KVReceiver, KVSender, KVTransferFailed, Sent

if TYPE_CHECKING:
    from .args import SimConfig
    from .req import Req

PACKAGE = "nixl-cu12"
POOL_SLOTS = 16  # request-sized slots in each engine's registered pool
NOTIF_POLL_S = 0.002  # while rooms wait for their KV
IDLE_POLL_S = 0.05  # otherwise: an idle engine should not spin on two shared cores
XFER_POLL_S = 0.0005
# Variables UCX and NIXL read from the process environment (the engine env file).
TRANSPORT_VARS = ("UCX_TLS", "UCX_NET_DEVICES", "UCX_IB_GPU_DIRECT_RDMA", "NIXL_PLUGIN_DIR")
# The sim process's own defaults, set by its entry point (`python -m pdctl.sim`) before NIXL
# loads UCX, which reads them then; a value from the engine env file wins. Together they take
# a sim's start-up from about 0.8 to 0.3 CPU-s (healthy after 0.3 s instead of 0.7 s), and the
# suite starts several hundred sims.
SIM_PROCESS_DEFAULTS = {
    # UCX's memory hooks patch the mmap family at start-up, spinning on sched_yield for about
    # 0.35 CPU-s. They keep UCX's registration cache valid when registered memory is
    # unmapped; the sim's one pool stays registered and mapped for the process's lifetime.
    "UCX_MEM_EVENTS": "no",
    # numpy's OpenBLAS starts a thread per core at import; the sim does no linear algebra.
    "OPENBLAS_NUM_THREADS": "1",
}


class TransferError(Exception):
    """A WRITE that did not complete; str() is NIXL's error text, as SGLang reports it."""


@dataclass
class PeerInfo:
    """KVArgsRegisterInfo: what a decode registers with the prefill."""

    agent_name: str
    agent_metadata: bytes
    pool_addr: int
    pool_len: int

    def to_json(self) -> dict[str, object]:
        return {
            "agent_name": self.agent_name,
            "agent_metadata": base64.b64encode(self.agent_metadata).decode("ascii"),
            "pool_addr": self.pool_addr,
            "pool_len": self.pool_len,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeerInfo:
        return cls(
            str(d["agent_name"]),
            base64.b64decode(str(d["agent_metadata"])),
            int(d["pool_addr"]),
            int(d["pool_len"]),
        )


def _import_api() -> Any:
    try:
        from nixl_cu12 import _api
    except ImportError as e:
        raise SystemExit(
            f"Error: --disaggregation-transfer-backend nixl needs the {PACKAGE} package "
            "(site.yml installs it on sim hosts; in a checkout: "
            f"pip install --no-deps -r requirements/nixl-sim.txt): {e}"
        ) from e
    return _api


def _start_error(env: Mapping[str, str], e: Exception) -> SystemExit:
    """One line naming the transport variables the failed backend was started with."""
    given = [f"{k}={env[k]}" for k in TRANSPORT_VARS if env.get(k)]
    where = (
        f"with {' '.join(given)} from the engine env file; check "
        f"{', '.join(k.split('=')[0] for k in given)}"
        if given
        else "with no UCX_* variables set"
    )
    return SystemExit(
        f"Error: NIXL could not start its UCX backend ({type(e).__name__}: {e}) {where}"
    )


class NixlKV:
    """One engine's NIXL agent and its registered KV pool."""

    def __init__(self, slot_bytes: int, env: Mapping[str, str], log: logging.Logger) -> None:
        api = _import_api()
        import numpy as np  # a dependency of nixl-cu12

        self.log = log
        self.name = str(uuid.uuid4())
        try:
            # No progress thread: NIXL 1.5.1 spins it with no delay (a core per idle engine);
            # the sim's polling of transfer states and notifications drives UCX instead.
            config = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
            self.agent = api.nixl_agent(self.name, config)
        except Exception as e:  # nixlBackendError: UCX refused its variables
            raise _start_error(env, e) from e
        if "UCX" not in self.agent.backends:
            raise _start_error(env, RuntimeError("UCX backend not instantiated"))
        self.slot_bytes = max(slot_bytes, 1)
        # Nonzero bytes, so a test can tell written pages from untouched ones.
        self.pool = np.full(self.slot_bytes * POOL_SLOTS, 0x5A, dtype=np.uint8)
        self.pool_addr = int(self.pool.ctypes.data)
        self.agent.register_memory([(self.pool_addr, self.pool.nbytes, 0, "")], "DRAM")
        # prefill: decode peers by agent name; decode: rooms whose notification arrived
        self.peers: dict[str, PeerInfo] = {}
        self.arrived: dict[int, asyncio.Event] = {}
        log.info("NIXL KVManager initialized with backend: UCX (agent %s)", self.name)

    def info(self) -> PeerInfo:
        return PeerInfo(
            self.name, self.agent.get_agent_metadata(), self.pool_addr, self.pool.nbytes
        )

    def slot_offset(self, room: int) -> int:
        """Where the decode preallocates a room's KV in its pool."""
        return (room % POOL_SLOTS) * self.slot_bytes

    # ----- prefill -------------------------------------------------------------------
    def add_peer(self, peer: PeerInfo) -> bool:
        """_add_remote_peer: False when the name was already registered (ignored)."""
        if peer.agent_name in self.peers:
            self.log.info("Peer %s was already registered, ignoring.", peer.agent_name)
            return False
        self.peers[peer.agent_name] = peer
        self.agent.add_remote_agent(peer.agent_metadata)
        return True

    async def write(self, peer_name: str, nbytes: int, dst_offset: int, room: int) -> float:
        """WRITE `nbytes` of this pool into the peer's pool at `dst_offset`, notifying the
        room; the seconds it took. Raises TransferError with NIXL's text."""
        peer = self.peers[peer_name]
        nbytes = min(nbytes, self.pool.nbytes, max(peer.pool_len - dst_offset, 0))
        local = self.agent.get_xfer_descs([(self.pool_addr, nbytes, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(peer.pool_addr + dst_offset, nbytes, 0)], "DRAM")
        t0 = time.perf_counter()
        handle = None
        try:
            handle = self.agent.initialize_xfer(
                "WRITE", local, remote, peer_name, str(room).encode()
            )
            state = self.agent.transfer(handle)
            while state == "PROC":
                await asyncio.sleep(XFER_POLL_S)
                state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                raise TransferError(f"NIXL transfer encountered ERR room={room}")
        except TransferError:
            self._reload_if_invalidated(peer)
            raise
        except Exception as e:  # nixlRemoteDisconnectError and kin: the text SGLang logs
            self._reload_if_invalidated(peer)
            raise TransferError(str(e)) from e
        finally:
            if handle is not None:
                self.agent.release_xfer_handle(handle)
        return time.perf_counter() - t0

    def _reload_if_invalidated(self, peer: PeerInfo) -> None:
        """_reload_invalidated_peers: NIXL may drop a peer's metadata after a remote
        disconnect; reload it from the registration we hold."""
        if self.agent.check_remote_metadata(peer.agent_name):
            return
        self.log.warning(
            "NIXL invalidated remote agent %s; reloading its metadata", peer.agent_name
        )
        try:
            self.agent.add_remote_agent(peer.agent_metadata)
        except Exception:
            self.log.exception(
                "Failed to reload NIXL metadata for remote agent %s", peer.agent_name
            )

    # ----- decode --------------------------------------------------------------------
    def expect(self, room: int) -> asyncio.Event:
        return self.arrived.setdefault(room, asyncio.Event())

    def forget(self, room: int) -> None:
        self.arrived.pop(room, None)

    async def pump_notifications(self) -> None:
        """Drain NIXL notifications into the rooms waiting for them (the decode's loop)."""
        while True:
            for msgs in self.agent.get_new_notifs().values():
                for msg in msgs:
                    try:
                        room = int(msg)
                    except ValueError:
                        continue
                    if room in self.arrived:
                        self.arrived[room].set()
            await asyncio.sleep(NOTIF_POLL_S if self.arrived else IDLE_POLL_S)


class NixlKVSender(KVSender):
    """The prefill's WRITE of a room's KV into its decode's registered pool."""

    def __init__(self, nixl: NixlKV, cfg: SimConfig, log: logging.Logger) -> None:
        self.nixl, self.knobs, self.log = nixl, cfg.knobs, log

    async def send(self, req: Req, session_id: str, dst_offset: int) -> Sent:
        if session_id not in self.nixl.peers:
            # transfer_worker asserts the agent is registered; conclude_failure has no
            # text for the AssertionError and reports its default.
            self.log.error("Unexpected transfer worker error for room %s", req.room)
            raise KVTransferFailed("KV transfer failed")
        k = self.knobs
        nbytes = max(int(req.prompt_tokens * k.kv_bytes_per_token * k.kv_transfer_scale), 1)
        try:
            seconds = await self.nixl.write(session_id, nbytes, dst_offset, req.room or 0)
        except TransferError as e:
            self.log.warning("NIXL transport error for room %s: %s", req.room, e)
            raise KVTransferFailed(str(e)) from e
        return Sent(nbytes, seconds)


class NixlKVReceiver(KVReceiver):
    """The decode's agent: registered by name with its metadata and pool; a room is in once
    the WRITE's notification for it arrived."""

    def __init__(self, nixl: NixlKV, spawn: Callable[[Awaitable[Any]], object]) -> None:
        self.nixl = nixl
        self.session_id = nixl.name
        spawn(nixl.pump_notifications())

    def registration(self) -> dict[str, object]:
        return {"kv_args": self.nixl.info().to_json()}

    def room_indices(self, room: int) -> dict[str, object]:
        return {"dst_offset": self.nixl.slot_offset(room)}

    def expect(self, room: int) -> asyncio.Event:
        return self.nixl.expect(room)

    def forget(self, room: int) -> None:
        self.nixl.forget(room)
