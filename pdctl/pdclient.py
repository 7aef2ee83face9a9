"""The PD-protocol client: requests through one pair's PD path, and through the gateway.

A pair canary does what the gateway does for a request: the same /generate body, with
`bootstrap_host/port/room` injected, sent to the pair's prefill and decode at once. It is
pinned to the pair (smg 1.13 cannot be told which pair to use: `x-smg-target-worker` is
ignored in PD mode) and fails exactly when bootstrap or KV transfer is broken, which each
engine's own /health never notices. `pdctl status`, `doctor`, `restart` (before the pair goes
back into the gateway, so clients never meet an unproven pair) and the pd-exporter use it.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import requests

T = TypeVar("T")


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    sent: int
    failed: int
    latency_s: float | None  # slowest successful request; None when none succeeded
    error: str | None = None  # the first failure
    duration_s: float = 0.0  # the whole check, failed requests included
    finished_at: float = 0.0  # wall-clock time (time.time()) at the end


def _has_text(body: object) -> bool:
    return isinstance(body, dict) and "text" in body


def _error_text(response: requests.Response) -> str:
    """The reason in an engine's error body: SGLang's OpenAI-style `{"message": ...}` or
    `{"error": {"message": ...}}` (http_server.py), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:600]


def _leg_failure(role: str, leg: Future[requests.Response]) -> str | None:
    try:
        response = leg.result()
        if response.status_code != 200:
            return f"{role} answered HTTP {response.status_code}: {_error_text(response)}"
        if role == "decode" and not _has_text(response.json()):
            return "decode answered without generated text"
    except (requests.RequestException, ValueError) as e:
        return f"{role}: {type(e).__name__}: {e}"
    return None


def _pair_request(
    prefill_url: str,
    decode_url: str,
    bootstrap_port: int,
    timeout: float,
    session: requests.Session,
) -> str | None:
    """One one-token request through the pair; the first failure, or None. The decode's
    failure comes first: SGLang reports a failed handshake or transfer there, and the
    prefill's leg then only waits out its bootstrap timeout."""
    body = {
        "text": "ping",
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "bootstrap_host": urlsplit(prefill_url).hostname,
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        legs = {
            role: pool.submit(session.post, f"{url}/generate", json=body, timeout=timeout)
            for role, url in (("decode", decode_url), ("prefill", prefill_url))
        }
        failures = [f for role, leg in legs.items() if (f := _leg_failure(role, leg))]
    return failures[0] if failures else None


# Requests per pair canary, by purpose (docs/operations.md, "The group canary"): a degraded pair
# fails only a share of requests, so the more at stake, the more requests.
CANARIES_STATUS = 3  # a view refreshed every few seconds: cheap
CANARIES_VERIFY = 5  # after a restart's first passing one, before the pair takes traffic
CANARIES_DOCTOR = 8  # a diagnosis: enough to find a pair failing one request in a few


def pair_canary(
    prefill_url: str,
    decode_url: str,
    bootstrap_port: int,
    count: int = 1,
    timeout: float = 10.0,
    session: requests.Session | None = None,
) -> CanaryResult:
    """`count` requests one after another: a degraded pair fails only a share of them."""
    failed, worst, error = 0, None, None
    start = time.monotonic()
    with requests.Session() if session is None else contextlib.nullcontext(session) as s:
        for _ in range(count):
            t0 = time.monotonic()
            err = _pair_request(prefill_url, decode_url, bootstrap_port, timeout, s)
            if err is None:
                worst = max(worst or 0.0, time.monotonic() - t0)
            else:
                failed += 1
                error = error or err
    return CanaryResult(
        failed == 0, count, failed, worst, error, time.monotonic() - start, time.time()
    )


def legs(prefills: Sequence[T], decodes: Sequence[T]) -> list[tuple[T, T]]:
    """(prefill, decode) couples that put every member of a pair or group on a PD path at
    least once, one per member of the larger role: a pair's one; a 2P1D group's two, each
    prefill with the decode."""
    p, d = prefills, decodes
    return [(p[n % len(p)], d[n % len(d)]) for n in range(max(len(p), len(d)))]


def group_canary(
    legs: list[tuple[str, str, int]],
    count: int = 1,
    timeout: float = 10.0,
    session: requests.Session | None = None,
) -> CanaryResult:
    """`count` requests through each (prefill URL, decode URL, bootstrap port) leg, one
    result for all: a group's legs put every prefill and decode on a PD path (a pair has one
    leg). With several legs the first failure names its leg."""
    results = [pair_canary(p, d, port, count, timeout, session) for p, d, port in legs]
    if len(results) == 1:
        return results[0]
    errors = [
        f"{p} -> {d}: {r.error}" for (p, d, _), r in zip(legs, results, strict=True) if r.error
    ]
    latencies = [r.latency_s for r in results if r.latency_s is not None]
    return CanaryResult(
        all(r.ok for r in results),
        sum(r.sent for r in results),
        sum(r.failed for r in results),
        max(latencies) if latencies else None,
        errors[0] if errors else None,
        sum(r.duration_s for r in results),
        max(r.finished_at for r in results),
    )


def gateway_canary(
    gateway_url: str, headers: dict[str, str], timeout: float = 10.0
) -> CanaryResult:
    """One request through the gateway, to whichever pair it picks."""
    t0 = time.monotonic()
    try:
        r = requests.post(
            f"{gateway_url}/generate",
            timeout=timeout,
            headers=headers,
            json={"text": "pdctl canary", "sampling_params": {"max_new_tokens": 1}},
        )
        error = None if r.status_code == 200 else f"gateway HTTP {r.status_code}: {r.text[:200]}"
    except requests.RequestException as e:
        error = f"gateway: {type(e).__name__}: {e}"
    took = time.monotonic() - t0
    if error is None:
        return CanaryResult(True, 1, 0, took, None, took, time.time())
    return CanaryResult(False, 1, 1, None, error, took, time.time())
