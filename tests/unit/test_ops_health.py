"""pdctl.ops.health and the pair canary against engines that answer junk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pdctl.ops import restart
from pdctl.ops.health import EngineProbe, HttpEngines, probe_engine, ready_probe
from pdctl.ops.report import StepFailed
from pdctl.pdclient import pair_canary
from tests.unit.ops_fakes import (
    FakeEngines,
    FakeGateway,
    FakeSystemd,
    fake_ops,
)


def test_an_engine_answering_html_is_probed_without_a_crash(
    fake_http: Callable[..., Any],
) -> None:
    engine = fake_http({"*": (200, b"<html>proxy login</html>")})
    p = probe_engine(engine.url)
    assert p.healthy and p.running is None
    assert (p.metrics_error or "").startswith("/metrics is not Prometheus text")
    # the restart's health wait takes it as healthy (/health is 200) and moves on
    ops = fake_ops(FakeSystemd(), FakeGateway(), engines=HttpEngines())
    pair = ops.source.pairs()[0]
    inst = pair.prefills[0].model_copy(update={"url": engine.url})
    dec = pair.decodes[0].model_copy(update={"url": engine.url})
    restart._wait_healthy(ops, replace(pair, prefills=(inst,), decodes=(dec,)))


def test_the_health_wait_reads_readiness_and_never_metrics(fake_http: Callable[..., Any]) -> None:
    """/ready is a flag check; /metrics is a page to fetch and parse, polled for nothing."""
    engine = fake_http({"/ready": (200, b""), "/metrics": (200, b"")})
    ops = fake_ops(FakeSystemd(), FakeGateway(), engines=HttpEngines())
    pair = ops.source.pairs()[0]
    inst = pair.prefills[0].model_copy(update={"url": engine.url})
    dec = pair.decodes[0].model_copy(update={"url": engine.url})
    restart._wait_healthy(ops, replace(pair, prefills=(inst,), decodes=(dec,)))
    assert engine.seen == [("GET", "/ready")] * 2
    assert ready_probe(fake_http({"/ready": (503, b""), "/ping": (503, b"")}).url).health == (
        "HTTP 503"
    )


@pytest.mark.parametrize("body", [b"5", b'["text"]', b"<html>"])
def test_pair_canary_against_answers_that_are_no_generate_object(
    fake_http: Callable[..., Any], body: bytes
) -> None:
    engine = fake_http({"/generate": (200, body)})
    res = pair_canary(engine.url, engine.url, 1, count=2)
    assert not res.ok and res.failed == 2
    assert res.error is not None and res.error.startswith(("decode answered without", "decode:"))


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"object": "error", "message": "Decode handshake failed", "code": 500}',
     "Decode handshake failed"),  # SGLang's OpenAI-style abort body
    (b'{"error": {"message": "bad sampling"}}', "bad sampling"),  # _create_error_response
    (b'{"error": "invalid type"}', "invalid type"),
    (b"<html>upstream down</html>", "<html>upstream down</html>"),
])  # fmt: skip
def test_pair_canary_names_the_engines_reason(
    fake_http: Callable[..., Any], body: bytes, reason: str
) -> None:
    failing, serving = (
        fake_http({"/generate": (500, body)}),
        fake_http({"/generate": (200, b'{"text": "x"}')}),
    )
    # The decode's failure is named even where the prefill's leg failed too.
    for prefill in (serving, failing):
        res = pair_canary(prefill.url, failing.url, 1)
        assert res.error == f"decode answered HTTP 500: {reason}"
    assert pair_canary(failing.url, serving.url, 1).error == f"prefill answered HTTP 500: {reason}"


def test_the_probe_reads_ready_and_tells_a_paused_engine_by_ping(
    fake_http: Callable[..., Any],
) -> None:
    ready = fake_http({"/ready": (200, b""), "/metrics": (200, b"")})
    p = probe_engine(ready.url)
    assert p.healthy and p.ready_path == "/ready" and ("GET", "/health") not in ready.seen
    paused = probe_engine(fake_http({"/ready": (503, b""), "/ping": (200, b"")}).url)
    assert paused.paused and not paused.healthy and paused.health == "paused"
    starting = probe_engine(fake_http({"/ready": (503, b""), "/ping": (503, b"")}).url)
    assert starting.health == "HTTP 503" and not starting.paused


def test_an_sglang_without_ready_is_probed_on_health(fake_http: Callable[..., Any]) -> None:
    """SGLang before 0.5.20 answers /ready 404: /health is what it has."""
    old = fake_http({"/health": (200, b""), "/metrics": (200, b"")})
    p = probe_engine(old.url)
    assert p.healthy and p.ready_path == "/health"
    assert old.seen[:2] == [("GET", "/ready"), ("GET", "/health")]
    down = probe_engine(fake_http({"/health": (503, b"")}).url)
    assert down.health == "HTTP 503" and down.ready_path == "/health"


def test_the_restart_waits_out_a_paused_engine_and_says_so() -> None:
    def probe(url: str) -> EngineProbe:
        return EngineProbe(url, "paused" if url.endswith("1") else "ok")

    ops = fake_ops(FakeSystemd(), FakeGateway(), engines=FakeEngines(probe))
    with pytest.raises(StepFailed, match=r"not healthy after 0s: pd0-decode paused"):
        restart._wait_healthy(ops, ops.source.pairs()[0])
