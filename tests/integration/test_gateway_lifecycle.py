"""The gateway's worker lifecycle with engines slower to start than smg's failure window
(docs/gateway.md, "The gateway's worker lifecycle"). Real smg 1.13 on the lifecycle flags
pdctl.render gives it, with windows of seconds; sim engines that take five simulated minutes
to load (15 s of wall time at the fixtures' time scale), several failure windows.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from pdctl import render, topology
from pdctl.ops.gateway import GatewayAdmin, ready
from pdctl.ops.restart import registrations
from pdctl.spec.profile import Router
from pdctl.testing.localproc import HOST, LocalPair, local_ops
from pdctl.testing.stack import Gateway, SimProc, constant_load, partner_env, wait_until

pytestmark = pytest.mark.gateway

# Five simulated minutes of weight loading and graph capture: 15 s at FAST_SIM_ENV's scale.
SLOW_START = {"PDSIM_STARTUP_DELAY_S": "300"}
# The failure window (interval x threshold) is 2 s: the engines load for several of them.
SHORT = Router(
    health_check_interval_secs=1,
    health_failure_threshold=2,
    health_success_threshold=1,
    health_check_timeout_secs=3,
    cb_failure_threshold=3,
    cb_success_threshold=1,
    cb_timeout_duration_secs=2,
    cb_window_duration_secs=30,
)
LOAD_S = 90  # the engines' 15 s start on a busy 2-core machine, and the requests after


def _slow_pair(sim_factory: Callable[..., SimProc]) -> LocalPair:
    prefill = sim_factory("prefill", env=SLOW_START)
    decode = sim_factory("decode", env={**SLOW_START, **partner_env(prefill)})
    return LocalPair("pd0", prefill, decode)


def _loading(sim: SimProc) -> bool:
    """Up and answering, but not taking work yet."""
    try:
        return requests.get(f"{sim.url}/ready", timeout=2).status_code != 200
    except requests.ConnectionError:
        return True


def _register(topo_file: Path) -> dict[str, str]:
    """The gateway unit's ExecStartPost= (`pdctl gateway register`), in its own process."""
    argv = render.register_command(HOST)[1:]
    done = subprocess.run(
        [sys.executable, "-c", "from pdctl.cli import main; main()", *argv,
         "--topology", str(topo_file), "--format", "json"],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (gw,) = json.loads(done.stdout)
    assert gw["error"] is None
    return dict(gw["workers"])


def _breakers(gw: Gateway) -> dict[str, float]:
    """smg's smg_worker_cb_state per worker URL (0 closed, 1 open, 2 half-open)."""
    text = requests.get(f"http://127.0.0.1:{gw.metrics_port}/metrics", timeout=5).text
    found = re.findall(r'^smg_worker_cb_state\{worker="([^"]+)"\} (\S+)$', text, re.M)
    return {url: float(v) for url, v in found}


def _requests_pass(gw: Gateway, n: int = 40) -> None:
    """`n` streamed requests through the gateway, none failed."""
    with constant_load(gw.url, clients=2, timeout=30) as outcomes:
        wait_until(lambda: len(outcomes) >= n, 60, f"{n} requests")
    failed = [o.failure for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed: {failed[:5]}"


def test_a_pair_slower_to_start_than_the_failure_window_ends_routable(
    sim_factory: Callable[..., SimProc],
    gateway_factory: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """site.yml's first converge or a host's reboot: the gateway starts and registers the
    pair while its engines load; then the decode crashes and loads again while smg holds it.
    Both times the pair ends routable with no operator step, and no breaker stays open."""
    pair = _slow_pair(sim_factory)
    gw = gateway_factory([], [], *render.lifecycle_args(SHORT))
    ops, _ = local_ops([pair], gw)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(topology.dump(ops.source.topology))
    urls = [pair.prefill.url, pair.decode.url]

    assert _register(topo_file) == dict.fromkeys(urls, "added")
    assert _loading(pair.prefill) and _loading(pair.decode)  # registered while loading
    admin = GatewayAdmin(gw.url)
    assert admin.wait(ready(urls), LOAD_S), admin.workers()
    _requests_pass(gw)

    # A crash: the decode dies, and loads for five simulated minutes again.
    pair.decode.kill()
    answers = [admin.canary().ok for _ in range(SHORT.cb_failure_threshold + 2)]
    assert not any(answers)
    assert set(_breakers(gw).values()) == {1.0}, "both sides' breakers open"
    pair.decode.start()
    wait_until(
        lambda: {w.url: w.status for w in admin.workers()}.get(pair.decode.url) == "failed",
        30,
        "smg to mark the loading decode failed",
    )
    assert _loading(pair.decode)
    # Kept, not removed (--no-remove-unhealthy-workers): it comes back by itself.
    assert admin.wait(ready(urls), LOAD_S), admin.workers()
    # The prefill's health never failed: its breaker lets a request through once its timeout
    # has passed, and the first request that passes closes it.
    wait_until(lambda: admin.canary().ok, SHORT.cb_timeout_duration_secs + 10, "a request")
    _requests_pass(gw)
    assert set(_breakers(gw).values()) == {0.0}, _breakers(gw)
    (bound,) = ops.source.pairs()
    assert {w.url: w.pairing for w in admin.workers()} == dict.fromkeys(urls, bound.id)


def test_a_pair_registered_again_starts_with_closed_breakers(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> None:
    """What a restart and a recovery rely on: the pair they take out of the gateway and
    register again has closed breakers at once, however long smg's breaker timeout."""
    prefill = sim_factory("prefill")
    decode = sim_factory("decode", env=partner_env(prefill))
    pair = LocalPair("pd0", prefill, decode)
    long_timeout = SHORT.model_copy(update={"cb_timeout_duration_secs": 600})
    gw = gateway_factory([], [], *render.lifecycle_args(long_timeout))
    ops, _ = local_ops([pair], gw)
    urls = [prefill.url, decode.url]
    admin = GatewayAdmin(gw.url)
    prefill.wait_healthy()
    decode.wait_healthy()
    admin.register(registrations(ops.source.pairs()))
    assert admin.wait(ready(urls), 30), admin.workers()
    decode.kill()
    assert not any(admin.canary().ok for _ in range(SHORT.cb_failure_threshold + 2))
    assert set(_breakers(gw).values()) == {1.0}
    decode.start().wait_healthy()
    admin.remove(urls)  # a restart's drain, then its register
    assert admin.wait(lambda ws: not ws, 30), admin.workers()
    admin.register(registrations(ops.source.pairs()))
    assert admin.wait(ready(urls), 30), admin.workers()
    assert set(_breakers(gw).values()) == {0.0}
    _requests_pass(gw)
