"""pdctl.ops.gateway: the API key, smg's admin API as GatewayAdmin speaks it, and the
predicates registration waits on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdctl.ops import gateway
from pdctl.ops.gateway import GatewayWorker
from pdctl.testing.stack import free_port


def test_register_waits_until_drained_entries_are_gone_or_bound_again() -> None:
    url = "http://10.0.0.1:30000"
    settled = gateway.settled([url], "node-a/pd0")

    def held(status: str, pairing: str | None) -> list[GatewayWorker]:
        return [GatewayWorker("a", url, "prefill", status, True, 0, pairing)]

    assert settled([])  # removed: POST /workers would be accepted
    assert not settled(held("draining", "node-a/pd0"))  # smg would answer 409
    assert settled(held("ready", "node-a/pd0"))  # a gateway restart registered it already
    assert not settled(held("ready", None))  # unbound: must be drained first


def test_gateway_key_from_env_or_the_gateway_env_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env_file = tmp_path / "gateway.env"
    env_file.write_text("# managed\nPDSTACK_GATEWAY_API_KEY=k-from-file\n")
    monkeypatch.setattr(gateway, "KEY_FILES", (tmp_path / "unreadable" / "gateway.env", env_file))
    monkeypatch.delenv(gateway.KEY_VAR, raising=False)
    assert gateway.api_key() == "k-from-file"
    monkeypatch.setenv(gateway.KEY_VAR, "k-from-env")
    assert gateway.api_key() == "k-from-env"
    monkeypatch.delenv(gateway.KEY_VAR)
    env_file.unlink()
    assert gateway.api_key() is None


@dataclass
class FakeResponse:
    status_code: int
    body: Any = None
    text: str = ""

    def json(self) -> Any:
        return self.body


def test_gateway_admin_sends_the_key_and_explains_a_401(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, dict[str, str]]] = []
    answers = [
        FakeResponse(
            200,
            {
                "workers": [
                    {
                        "id": "w1",
                        "url": "http://a:1",
                        "worker_type": "decode",
                        "status": "ready",
                        "is_healthy": True,
                        "load": 2,
                    },
                    {  # a DELETE sent already: a second one would start a second removal
                        "id": "w2",
                        "url": "http://b:3",
                        "worker_type": "prefill",
                        "status": "draining",
                        "is_healthy": True,
                        "load": 0,
                    },
                ]
            },
        ),
        FakeResponse(202),
        FakeResponse(401),
    ]

    def fake_request(method: str, url: str, headers: dict[str, str], **_: Any) -> FakeResponse:
        seen.append((method, url, headers))
        return answers.pop(0)

    monkeypatch.setattr(gateway.requests, "request", fake_request)
    gw = gateway.GatewayAdmin("http://gw:8000/", api_key="sekrit")
    gw.remove(["http://a:1", "http://b:3", "http://not-registered:2"])
    assert [(m, u) for m, u, _ in seen] == [
        ("GET", "http://gw:8000/workers"),
        ("DELETE", "http://gw:8000/workers/w1"),
    ]
    assert seen[0][2] == {"Authorization": "Bearer sekrit"}
    with pytest.raises(
        gateway.GatewayError, match="needs the API key: set PDSTACK_GATEWAY_API_KEY"
    ):
        gw.workers()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>", "not JSON: '<html>'"),
        (b'{"workers": [{"url": "http://a:1"}]}', "workers.0.id: Field required"),
        (b'{"workers": "all"}', "workers: Input should be a valid list"),
    ],
)
def test_gateway_listing_that_is_not_smgs(
    fake_http: Callable[..., Any], body: bytes, why: str
) -> None:
    gw = fake_http({"/workers": (200, body)})
    with pytest.raises(gateway.GatewayError) as e:
        gateway.GatewayAdmin(gw.url).workers()
    assert "GET /workers answered 200 but not smg's worker list" in str(e.value)
    assert why in str(e.value)


def test_reachable_is_any_answer_and_no_connection_is_none(
    fake_http: Callable[..., Any],
) -> None:
    failing = fake_http({"*": (503, b"starting")})
    assert gateway.GatewayAdmin(failing.url).reachable(1.0)  # an error is an answer
    assert failing.seen == [("GET", "/readiness")]
    assert not gateway.GatewayAdmin(f"http://127.0.0.1:{free_port()}").reachable(1.0)


def test_a_decode_is_registered_with_its_running_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """smg's PD admission bounds dispatch to a decode by its `max_running_requests` label and
    is off without one: pdctl sends the profile's value; a worker without one gets no labels
    (smg keeps those it read from /server_info)."""
    bodies: list[dict[str, Any]] = []

    def fake_request(method: str, url: str, headers: dict[str, str], **kw: Any) -> FakeResponse:
        bodies.append(kw["json"])
        return FakeResponse(202)

    monkeypatch.setattr(gateway.requests, "request", fake_request)
    gw = gateway.GatewayAdmin("http://gw:8000")
    gw.add("http://d:1", "decode", None, "h/pd0", running_window=32)
    gw.add("http://p:1", "prefill", 8998, "h/pd0")
    assert bodies[0]["labels"] == {"max_running_requests": "32"}
    assert "labels" not in bodies[1]
