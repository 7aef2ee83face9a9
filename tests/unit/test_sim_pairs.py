"""The sim's cross-group accounting: a decode told its partner prefill counts KV taken from any
other (`pdsim_cross_group_transfers_total`), and the render passes the partner to every decode."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pdctl.render import environment
from pdctl.spec import Deployment
from pdctl.testing.stack import free_port, in_process, pd_generate

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}
METRIC = "pdsim_cross_group_transfers"


def cross_group(text: str) -> float | None:
    """The counter's value, None when the family is absent."""
    for fam in text_string_to_metric_families(text):
        if fam.name == METRIC:
            return sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return None


async def serve_through(partner: bool) -> tuple[float | None, float | None]:
    """Two prefills, one decode; one request through each prefill. The counter before and
    after."""
    ports = [free_port(), free_port()]
    env = {**FAST, "PDSIM_PAIR_PARTNER": f"127.0.0.1:{ports[0]}"} if partner else FAST
    async with (
        in_process("prefill", FAST, "--enable-metrics", bootstrap_port=ports[0]) as own,
        in_process("prefill", FAST, "--enable-metrics", bootstrap_port=ports[1]) as other,
        in_process("decode", env, "--enable-metrics") as decode,
        aiohttp.ClientSession() as http,
    ):

        async def metrics() -> float | None:
            async with http.get(f"{decode.url}/metrics") as resp:
                return cross_group(await resp.text())

        before = await metrics()
        for room, (prefill, port) in enumerate(zip((own, other), ports, strict=True), 1):
            legs = await pd_generate(
                http, prefill.url, decode.url, port, room, text="one request through each prefill"
            )
            for status, text in legs:
                assert status == 200, text
        return before, await metrics()


def test_decode_counts_requests_from_another_pairs_prefill() -> None:
    before, after = asyncio.run(asyncio.wait_for(serve_through(partner=True), 60))
    assert (before, after) == (0, 1)


def test_without_a_partner_the_counter_is_absent_not_zero() -> None:
    before, after = asyncio.run(asyncio.wait_for(serve_through(partner=False), 60))
    assert (before, after) == (None, None)


def test_render_gives_each_sim_decode_its_own_prefill(
    load: Callable[..., Deployment], shipped: Callable[[str], dict[str, Any]]
) -> None:
    dep = load(shipped("sim"), hosts=["node-1", "node-2"])
    pairs = dep.groups()
    assert len(pairs) == 2
    for pair in pairs:
        prefill, decode = pair.instances
        env = environment(decode, dep)
        assert env["PDSIM_PAIR_PARTNER"] == f"{prefill.address}:{prefill.bootstrap_port}"
        assert "PDSIM_PAIR_PARTNER" not in environment(prefill, dep)
    real = load(shipped("reference"))
    assert all("PDSIM_PAIR_PARTNER" not in environment(i, real) for i in real.instances)
