"""How a PD leg fails its request: SGLang's KV-transfer failure line, and which rooms a
degraded pair (PDSIM_DEGRADED=on, a modelled failure) fails."""

from __future__ import annotations

import logging
import random
from http import HTTPStatus

from .req import Req
from .scheduler import Scheduler


def fail_transfer(
    engine: Scheduler, log: logging.Logger, req: Req, what: str, var: str, reason: str
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
