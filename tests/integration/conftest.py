"""Local-process fixtures: simulated SGLang engines (pdctl.sim) and the real gateway (smg).

Every process is started here, tracked by PID and stopped by PID in a finally block
(pdctl.testing.stack: SIGTERM, then SIGKILL). Reuse them from any integration test:

- `sim_factory(mode="null", *, backend="nixl", extra=(), env=None, port=None,
  bootstrap_port=None, start=True) -> SimProc`: one engine (`mode`: null|prefill|decode)
  with FAST_SIM_ENV (simulated time 20x faster) plus `env`.
- `gateway_factory(prefills, decodes, *extra_args) -> Gateway`: `smg launch
  --pd-disaggregation` in front of engines (skips the test when smg is not installed).
- `pd_stack -> PDStack`: healthy prefill + decode + gateway (retries disabled, so the
  engines' answers reach the client unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pdctl.testing.stack import Gateway, PDStack, SimProc, smg_binary, start_gateway

# Simulated time runs 20x faster than the wall clock: SGLang's 5 s heartbeat is 0.25 s,
# the 40 s PD timeouts set here are 2 s.
FAST_SIM_ENV = {
    "PDSIM_TIME_SCALE": "0.05",
    "PDSIM_STARTUP_DELAY_S": "4",
    "PDSIM_SEED": "7",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "40",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "40",
}


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[Callable[..., SimProc]]:
    started: list[SimProc] = []

    def make(
        mode: str = "null",
        *,
        backend: str = "nixl",
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
        bootstrap_port: int | None = None,
        start: bool = True,
        address: str = "127.0.0.1",
    ) -> SimProc:
        sim = SimProc.create(
            mode,
            tmp_path,
            {**FAST_SIM_ENV, **(env or {})},
            backend=backend,
            extra=extra,
            port=port,
            bootstrap_port=bootstrap_port,
            address=address,
        )
        started.append(sim)
        return sim.start() if start else sim

    try:
        yield make
    finally:
        for sim in started:
            sim.stop()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    binary = smg_binary()
    if binary is None:
        pytest.skip("smg (the SGLang model gateway) is not installed; run scripts/setup.sh")
    started: list[Gateway] = []

    def make(prefills: list[SimProc], decodes: list[SimProc], *extra: str) -> Gateway:
        gw = start_gateway(binary, prefills, decodes, tmp_path, *extra)
        started.append(gw)
        return gw

    try:
        yield make
    finally:
        for gw in started:
            gw.stop()


@pytest.fixture
def pd_stack(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> PDStack:
    prefill = sim_factory("prefill")
    decode = sim_factory("decode")
    prefill.wait_healthy()
    decode.wait_healthy()
    gateway = gateway_factory([prefill], [decode], "--disable-retries").wait_ready()
    return PDStack(prefill, decode, gateway)
