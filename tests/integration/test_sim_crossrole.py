"""A misconfigured pair rehearsed with local sims fails as sglang 0.5.23 fails it
(pdctl/sim/handshake.py): pdctl's pair canary names SGLang's reason and the decode counts the
failure in `sglang:num_bootstrap_failed_reqs`, or the decode dies at its first request with
SGLang's traceback line. One prefill serves every decode of the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from pdctl.pdclient import pair_canary
from pdctl.testing.stack import SimProc
from tests.integration.conftest import FAST_SIM_ENV

POLICY = "--disaggregation-decode-allocation-policy"
# The prefill's leg gives up on an unbootstrapped room after 10 simulated seconds (0.5 s), so
# a canary's failure costs well under its timeout.
ENV = {
    **FAST_SIM_ENV,
    "PDSIM_STARTUP_DELAY_S": "1",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "10",
}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimProc]]:
    log_dir: Path = tmp_path_factory.mktemp("crossrole")

    def sim(mode: str, *extra: str) -> SimProc:
        return SimProc.create(mode, log_dir, ENV, backend="mooncake", extra=extra)

    started = {
        "prefill": sim("prefill"),
        "matching": sim("decode"),
        "policy": sim("decode", POLICY, "prefill_complete"),
        "page_size": sim("decode", "--page-size", "16"),
    }
    try:
        for s in started.values():
            s.start()
        for s in started.values():
            s.wait_healthy()
        yield started
    finally:
        for s in started.values():
            s.stop()


def bootstrap_failed(decode: SimProc) -> float:
    text = requests.get(f"{decode.url}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sglang:num_bootstrap_failed_reqs_total"
    )


def test_a_matching_decode_passes_through_the_same_prefill(sims: dict[str, SimProc]) -> None:
    prefill, decode = sims["prefill"], sims["matching"]
    result = pair_canary(prefill.url, decode.url, prefill.bootstrap_port, count=2, timeout=5)
    assert (result.ok, result.failed, result.error) == (True, 0, None)
    assert bootstrap_failed(decode) == 0


def test_allocation_policy_mismatch_fails_every_request_naming_it(
    sims: dict[str, SimProc],
) -> None:
    prefill, decode = sims["prefill"], sims["policy"]
    before = bootstrap_failed(decode)
    result = pair_canary(prefill.url, decode.url, prefill.bootstrap_port, count=2, timeout=5)
    assert (result.ok, result.failed) == (False, 2)
    assert result.error is not None
    assert result.error.startswith("decode answered HTTP 500: Decode handshake failed")
    assert result.error.endswith(
        "Disaggregation decode allocation policy mismatch: prefill=early, "
        "decode=prefill_complete. Set --disaggregation-decode-allocation-policy identically "
        "on both roles."
    )
    assert bootstrap_failed(decode) == before + 2
    assert decode.log_text().count("Decode handshake failed for request rank=0") >= 2
    assert decode.proc is not None and decode.proc.poll() is None  # failing, not dead


def test_page_size_mismatch_kills_the_decode_at_its_first_request(
    sims: dict[str, SimProc],
) -> None:
    prefill, decode = sims["prefill"], sims["page_size"]
    assert decode.proc is not None
    result = pair_canary(prefill.url, decode.url, prefill.bootstrap_port, timeout=5)
    assert not result.ok and result.error is not None
    assert result.error.startswith("decode: ConnectionError")
    assert decode.proc.wait(timeout=10) == -9  # SIGKILL of itself: systemd's status=9/KILL
    log = decode.log_text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert (
        "RuntimeError: Page size mismatch: prefill server has page_size=1, but decode server "
        "has page_size=16. Both servers must use the same --page-size value."
    ) in log
    assert "It usually means one child failed." in log
    # Only the decode died: the prefill still serves.
    assert requests.get(f"{prefill.url}/ready", timeout=5).status_code == 200
