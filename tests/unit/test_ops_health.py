"""pdctl.ops.health and the pair canary against engines that answer junk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pdctl.ops import restart
from pdctl.ops.health import HttpEngines, probe_engine
from pdctl.pdclient import pair_canary
from tests.unit.ops_fakes import (
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


@pytest.mark.parametrize("body", [b"5", b'["text"]', b"<html>"])
def test_pair_canary_against_answers_that_are_no_generate_object(
    fake_http: Callable[..., Any], body: bytes
) -> None:
    engine = fake_http({"/generate": (200, body)})
    res = pair_canary(engine.url, engine.url, 1, count=2)
    assert not res.ok and res.failed == 2
    assert res.error is not None and res.error.startswith(("decode answered without", "decode:"))
