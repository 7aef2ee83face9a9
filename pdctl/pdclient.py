"""Pair canaries for status, doctor and restart, on top of the exporter's probe.

The probe (pdctl.exporter.canary) does what the gateway does for a request: the same
/generate body, with `bootstrap_host/port/room` injected, sent to the pair's prefill and
decode at once. smg 1.13 cannot be told which pair to use (`x-smg-target-worker` is ignored
in PD mode), and the restart runs the canary before the pair goes back into the gateway, so
clients never meet an unproven pair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests

from pdctl.exporter.canary import PairTarget, probe


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    sent: int
    failed: int
    latency_s: float | None  # slowest successful request
    error: str | None = None  # the first failure


def pair_canary(
    prefill_url: str, decode_url: str, bootstrap_port: int, count: int = 1, timeout: float = 10.0
) -> CanaryResult:
    """`count` requests one after another: a degraded pair fails only a share of them."""
    target = PairTarget("", prefill_url, decode_url, bootstrap_port)
    failed, worst, error = 0, None, None
    with requests.Session() as session:
        for _ in range(count):
            r = probe(target, timeout, session)
            if r.success:
                worst = max(worst or 0.0, r.duration_s)
            else:
                failed += 1
                error = error or r.error
    return CanaryResult(failed == 0, count, failed, worst, error)


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
    if error is None:
        return CanaryResult(True, 1, 0, time.monotonic() - t0)
    return CanaryResult(False, 1, 1, None, error)
