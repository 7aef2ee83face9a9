"""The KV transfer's interface, as SGLang's `disaggregation/base/conn.py` has it: a room's
states (KVPoll), the prefill's sender and the decode's receiver, and the backend without
NIXL ("http": the room's result travels over the bootstrap server's room poll and the bytes
are a sleep at KV_TRANSFER_GB_S). The NIXL backend is nixl_conn.py.

The room poll's JSON keeps the sim's wire words: "pending" until the room concludes, then
"ready" (Success) or "failed".
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from .args import SimConfig
    from .model import Clock
    from .req import Req

KV_TRANSFER_GB_S = 20.0  # simulated link speed (same-host PCIe, UCX)


class KVPoll(IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4

    @property
    def concluded(self) -> bool:
        return self in (KVPoll.Failed, KVPoll.Success)

    @property
    def wire(self) -> str:
        """The room poll's `state`."""
        return _WIRE.get(self, "pending")

    @classmethod
    def from_wire(cls, state: str) -> KVPoll:
        """A decode's view of the room poll's `state`: waiting until it concludes."""
        return {v: k for k, v in _WIRE.items()}.get(state, cls.WaitingForInput)


_WIRE = {KVPoll.Success: "ready", KVPoll.Failed: "failed"}


class KVTransferFailed(Exception):
    """A room's KV did not reach the decode; str() is the reason SGLang reports."""


@dataclass(frozen=True)
class Sent:
    nbytes: int
    seconds: float


class KVSender(ABC):
    """The prefill's side: moves a bootstrapped room's KV to its decode."""

    @abstractmethod
    async def send(self, req: Req, session_id: str, dst_offset: int) -> Sent:
        """The room's KV to the decode session; raises KVTransferFailed."""


class KVReceiver:
    """The decode's side: what it registers with a prefill, what it sends per room, and
    how it learns that a room's bytes landed. The defaults are the http backend's: nothing
    beyond the session id, and the room poll's result is all there is."""

    session_id: str

    def registration(self) -> dict[str, object]:
        """Fields the session's registration with a prefill adds."""
        return {}

    def room_indices(self, room: int) -> dict[str, object]:
        """Fields a room's bootstrap adds (where its KV goes)."""
        return {}

    def expect(self, room: int) -> asyncio.Event | None:
        """An event set when the room's bytes landed; None: the room poll's result is all
        there is to wait for."""
        return None

    def forget(self, room: int) -> None:
        """The room is over: drop what `expect` keeps for it."""


class HttpKVSender(KVSender):
    def __init__(self, cfg: SimConfig, clock: Clock) -> None:
        self.kv_bytes_per_token = cfg.knobs.kv_bytes_per_token
        self.clock = clock

    async def send(self, req: Req, session_id: str, dst_offset: int) -> Sent:
        nbytes = req.prompt_tokens * self.kv_bytes_per_token
        seconds = nbytes / 1e9 / KV_TRANSFER_GB_S
        await self.clock.sleep(seconds)
        return Sent(nbytes, seconds)


class HttpKVReceiver(KVReceiver):
    def __init__(self) -> None:
        self.session_id = uuid.uuid4().hex
