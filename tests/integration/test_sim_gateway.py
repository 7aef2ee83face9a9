"""pdctl.sim prefill + decode behind the real SGLang model gateway (smg), as local processes.

Time in the engines runs 20x faster (conftest.FAST_SIM_ENV); every wait has a timeout and
no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from pdctl.bench.stream import StreamCheck
from pdctl.testing.stack import Gateway, PDStack, SimProc, wait_until

pytestmark = pytest.mark.gateway

TIMEOUT = 30


def sse_events(resp: requests.Response) -> list[Any]:
    """The `data:` payloads of an SSE response, JSON-decoded except `[DONE]`."""
    out: list[Any] = []
    for line in resp.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def chat(url: str, **body: Any) -> requests.Response:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hello there"}], **body}
    return requests.post(
        f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT, stream=bool(body.get("stream"))
    )


def completion_statuses(url: str, n: int) -> list[int]:
    return [
        requests.post(
            f"{url}/v1/completions",
            json={"model": "sim", "prompt": "hi", "max_tokens": 4},
            timeout=TIMEOUT,
        ).status_code
        for _ in range(n)
    ]


def test_streamed_chat_and_completions_flow_through_gateway(pd_stack: PDStack) -> None:
    events = sse_events(
        chat(pd_stack.url, max_tokens=6, stream=True, stream_options={"include_usage": True})
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # SGLang's msgspec delta always carries reasoning_content (sse_utils.StreamDelta).
    assert chunks[0]["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(text.split()) == 6
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6

    resp = requests.post(
        f"{pd_stack.url}/v1/completions",
        timeout=TIMEOUT,
        stream=True,
        json={"model": "sim", "prompt": "once upon", "max_tokens": 5, "stream": True},
    )
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for e in events[:-1] if e["choices"][0]["text"]) == 5

    body = chat(pd_stack.url, max_tokens=3).json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 3
    gen = requests.post(
        f"{pd_stack.url}/generate",
        timeout=TIMEOUT,
        json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
    ).json()
    assert gen["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    # Both legs ran: the prefill logged a prefill batch with the PD fields.
    assert "#bootstrap-req: " in pd_stack.prefill.log_text()


def test_readiness_only_after_both_sides_are_up(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> None:
    prefill = sim_factory("prefill", start=False)
    decode = sim_factory("decode", start=False)
    gateway = gateway_factory([prefill], [decode])
    ready = f"{gateway.url}/readiness"
    wait_until(
        lambda: requests.get(ready, timeout=2).status_code == 503,
        TIMEOUT,
        "gateway answering not-ready",
    )
    prefill.start().wait_healthy()
    # Let the gateway run a few startup checks with only the prefill up.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert requests.get(ready, timeout=2).status_code == 503
        time.sleep(0.25)
    decode.start().wait_healthy()
    gateway.wait_ready(TIMEOUT)
    assert chat(gateway.url, max_tokens=2).status_code == 200


def test_killing_the_decode_fails_inflight_streams(pd_stack: PDStack) -> None:
    resp = chat(pd_stack.url, max_tokens=4000, stream=True)
    lines = resp.iter_lines(decode_unicode=True)
    seen = 0
    for line in lines:
        if line.startswith("data: ") and '"content"' in line:
            seen += 1
            if seen == 5:
                break
    pd_stack.decode.kill(signal.SIGKILL)
    rest = [line for line in lines if line.startswith("data: ")]
    assert not any('"finish_reason":"length"' in line for line in rest)
    errors = [json.loads(line[6:]) for line in rest if '"error"' in line]
    assert errors, rest[-3:]
    # The load clients' rule (pdctl.bench.stream) counts it failed, though the status was 200.
    check = StreamCheck(4000)
    for line in rest:
        check.feed(line[len("data: ") :])
    assert resp.status_code == 200
    assert (check.failure() or "").startswith("error in the stream: "), (check, rest[-3:])


HUNG_TIMEOUT_S = 4


def test_the_request_timeout_bounds_a_client_of_a_hung_decode(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> None:
    """A decode that hangs mid-stream (SIGSTOP: it holds the connection and never answers)
    holds its client no longer than the gateway's request timeout (router.request_timeout_secs,
    rendered as smg's --request-timeout-secs): the stream ends with smg's error, which the load
    clients' rule counts failed."""
    prefill, decode = sim_factory("prefill"), sim_factory("decode")
    prefill.wait_healthy()
    decode.wait_healthy()
    gw = gateway_factory(
        [prefill], [decode], "--disable-retries", "--request-timeout-secs", str(HUNG_TIMEOUT_S)
    ).wait_ready()
    start = time.monotonic()
    resp = chat(gw.url, max_tokens=4000, stream=True)
    check = StreamCheck(4000)
    try:
        for line in resp.iter_lines(decode_unicode=True):
            if not line.startswith("data: "):
                continue
            check.feed(line[len("data: ") :])
            if check.content_chunks == 5 and decode.proc.poll() is None:
                decode.proc.send_signal(signal.SIGSTOP)
        took = time.monotonic() - start
    finally:
        decode.proc.send_signal(signal.SIGCONT)
    assert resp.status_code == 200
    assert (check.failure() or "").startswith("error in the stream: Stream error:"), check
    assert "operation timed out" in (check.error or ""), check
    assert HUNG_TIMEOUT_S <= took < HUNG_TIMEOUT_S + 3, took


def test_lost_prefill_fails_requests_waiting_for_kv(
    sim_factory: Callable[..., SimProc],
) -> None:
    prefill = sim_factory("prefill").wait_healthy()
    decode = sim_factory("decode").wait_healthy()
    # Only the decode leg: its room waits for KV that the prefill never sends.
    body = {
        "text": "hi",
        "sampling_params": {"max_new_tokens": 3},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": 4242,
    }
    result: dict[str, requests.Response] = {}
    t = threading.Thread(
        target=lambda: result.setdefault(
            "r", requests.post(f"{decode.url}/generate", json=body, timeout=TIMEOUT)
        )
    )
    t.start()
    room = f"http://127.0.0.1:{prefill.bootstrap_port}/pdsim/rooms/4242?wait=0"
    wait_until(
        lambda: requests.get(room, timeout=2).json()["state"] == "pending",
        TIMEOUT,
        "the decode to bootstrap its room",
    )
    prefill.kill(signal.SIGKILL)
    t.join(TIMEOUT)
    resp = result["r"]
    assert resp.status_code == 500
    assert resp.json()["code"] == 500
    assert (
        "Lost connection with prefill instance (bootstrap_addr: 127.0.0.1:"
        in resp.json()["message"]
    )
    assert "Lost connection with prefill instance" in decode.log_text()


def test_with_real_nixl_a_lone_decode_restart_leaves_the_pair_working(pd_stack: PDStack) -> None:
    """The restarted decode is a new NIXL agent the prefill registers beside the old one."""
    assert set(completion_statuses(pd_stack.url, 6)) == {200}
    pd_stack.decode.restart().wait_healthy()
    pd_stack.gateway.wait_ready(TIMEOUT)
    assert set(completion_statuses(pd_stack.url, 12)) == {200}
    assert "Peer " not in pd_stack.prefill.log_text()  # a new name, not a re-registration
    assert "the pair is degraded" not in pd_stack.prefill.log_text()


# PDSIM_DEGRADED=on: the modelled production failure NIXL over host memory cannot show.
DEGRADED = {"PDSIM_DEGRADED": "on"}


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_lone_restart_degrades_the_pair_until_both_restart(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway], side: str
) -> None:
    prefill = sim_factory("prefill", env=DEGRADED).wait_healthy()
    decode = sim_factory("decode", env=DEGRADED).wait_healthy()
    # The engines' answers reach the client unchanged: no retries, and no circuit breakers.
    # Those open at smg's default 10 failures, which a degraded round can reach, and stayed
    # open through a restart of both engines quicker than smg's probe: all 503 ("all circuits
    # open"), not the healed pair's 200s.
    gateway = gateway_factory(
        [prefill], [decode], "--disable-retries", "--disable-circuit-breaker"
    ).wait_ready()
    pd_stack = PDStack(prefill, decode, gateway)
    assert set(completion_statuses(pd_stack.url, 6)) == {200}
    restarted, survivor = (
        (pd_stack.decode, pd_stack.prefill)
        if side == "decode"
        else (pd_stack.prefill, pd_stack.decode)
    )
    restarted.restart().wait_healthy()
    pd_stack.gateway.wait_ready(TIMEOUT)
    statuses = completion_statuses(pd_stack.url, 24)
    assert statuses.count(500) >= 3, statuses  # half fail on average (PDSIM_DEGRADED_FAIL_RATIO)
    assert "the pair is degraded" in survivor.log_text()
    pd_stack.prefill.stop()
    pd_stack.decode.stop()
    pd_stack.prefill.start().wait_healthy()
    pd_stack.decode.start().wait_healthy()
    pd_stack.gateway.wait_ready(TIMEOUT)
    assert set(completion_statuses(pd_stack.url, 24)) == {200}


def test_degraded_pair_in_hang_mode_ends_in_timeouts(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> None:
    env = {**DEGRADED, "PDSIM_DEGRADED_MODE": "hang", "PDSIM_DEGRADED_FAIL_RATIO": "1"}
    prefill = sim_factory("prefill", env=env).wait_healthy()
    decode = sim_factory("decode", env=env).wait_healthy()
    gateway = gateway_factory([prefill], [decode], "--disable-retries").wait_ready()
    assert set(completion_statuses(gateway.url, 2)) == {200}
    decode.restart().wait_healthy()
    gateway.wait_ready(TIMEOUT)
    r = requests.post(
        f"{gateway.url}/v1/completions",
        timeout=TIMEOUT,
        json={"model": "sim", "prompt": "hi", "max_tokens": 4},
    )
    assert r.status_code == 500
    assert "timed out after" in r.text  # the 40 s (simulated) PD timeouts fired


def test_degradation_is_off_for_mooncake(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> None:
    prefill = sim_factory("prefill", backend="mooncake").wait_healthy()
    decode = sim_factory("decode", backend="mooncake").wait_healthy()
    gateway = gateway_factory([prefill], [decode], "--disable-retries").wait_ready()
    assert set(completion_statuses(gateway.url, 3)) == {200}
    decode.restart().wait_healthy()
    gateway.wait_ready(TIMEOUT)
    assert set(completion_statuses(gateway.url, 12)) == {200}


def test_bad_inputs_get_sglang_answers(sim_factory: Callable[..., SimProc]) -> None:
    prefill = sim_factory("prefill").wait_healthy()
    decode = sim_factory("decode").wait_healthy()
    url = decode.url

    r = requests.post(
        f"{url}/v1/chat/completions",
        data="{not json",
        timeout=TIMEOUT,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["type"] == "Bad Request" and "json_invalid" in r.json()["message"]

    # Unknown fields are ignored, as SGLang's request models allow extras.
    r = requests.post(
        f"{url}/v1/chat/completions",
        timeout=TIMEOUT,
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
            "frobnicate": 1,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": 1,
            "rid": "unknown-fields",
        },
    )
    assert r.status_code == 500  # the prefill leg never ran: the room times out
    assert "timed out" in r.json()["message"]

    r = requests.post(
        f"{url}/v1/chat/completions",
        timeout=TIMEOUT,
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    )
    assert r.status_code == 400
    assert r.json()["type"] == "BadRequestError"
    assert r.json()["message"].startswith(
        "Invalid request: Disaggregated request received without bootstrap room id."
    )

    started = time.monotonic()
    r = requests.post(
        f"{url}/generate",
        timeout=TIMEOUT,
        json={"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": 9, "bootstrap_room": 5},
    )
    assert r.status_code == 500
    assert r.json()["message"].startswith("Decode handshake failed for request rank=0")
    assert r.json()["message"].endswith("KVTransferError(bootstrap_room=5): Aborted by AbortReq.")
    assert time.monotonic() - started < TIMEOUT

    r = requests.post(
        f"{url}/v1/completions",
        timeout=TIMEOUT,
        json={"prompt": "x", "max_tokens": 100000, "bootstrap_room": 3},
    )
    assert r.status_code == 400
    assert r.json() == {
        "object": "error",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
        "message": "Requested token count exceeds the model's maximum context length of 8192 "
        "tokens. You requested a total of 100001 tokens: 1 tokens from the input messages and "
        "100000 tokens for the completion. Please reduce the number of tokens in the input "
        "messages or the completion to fit within the limit.",
    }


def test_bad_input_status_passes_through_gateway(pd_stack: PDStack) -> None:
    r = chat(pd_stack.url, max_tokens=100000)
    assert r.status_code == 400
    assert "maximum context length of 8192 tokens" in r.text


def test_eager_batch_can_crash_like_the_seeds_oom(sim_factory: Callable[..., SimProc]) -> None:
    sim = sim_factory(
        "null", extra=("--cuda-graph-max-bs-decode", "2"), env={"PDSIM_EAGER_OOM": "1"}
    ).wait_healthy()
    body = {"prompt": "x", "max_tokens": 500}

    def post() -> None:
        with contextlib.suppress(requests.RequestException):
            requests.post(f"{sim.url}/v1/completions", json=body, timeout=TIMEOUT)

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert sim.proc is not None and sim.proc.wait(TIMEOUT) == 1
    assert "torch.OutOfMemoryError: CUDA out of memory." in sim.log_text()
