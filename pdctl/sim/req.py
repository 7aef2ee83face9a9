"""A request as the scheduler holds it, and the events it sends its client.

Outputs go to each request's queue as `Token`, `Finish` or `Abort` events.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from http import HTTPStatus

from .sampling import Sample, Sampler


@dataclass(frozen=True)
class Token:
    text: str  # the output text it releases (stop strings and their possible starts held back)
    sample: Sample | None = None


@dataclass(frozen=True)
class Finish:
    reason: str  # "length" | "stop" | "abort" (an abort without a status: a normal answer)
    matched: int | str | None = None  # the stop string or token id, as meta_info reports it
    tail: str = ""  # text held back for a stop string that never came
    # reason "abort": meta_info's finish_reason, as the scheduler or tokenizer manager sets it
    abort: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Abort:
    message: str
    status: HTTPStatus


Event = Token | Finish | Abort


@dataclass(eq=False)
class Req:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    finish_reason: str  # reported when max_new_tokens is reached
    stream: bool
    text: Sampler
    created: float
    room: int | None = None
    log_metrics: bool = True
    # Health checks carry a fake bootstrap host: no peer, no transfer.
    fake_bootstrap: bool = False
    out: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    generated: int = 0
    reserved: int = 0
    done: bool = False
    admitted: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefilled: asyncio.Event = field(default_factory=asyncio.Event)
    forwarded: bool = False
    prefill_attempts: int = 0  # Req.prefill_attempt_count
