"""pdctl.sim HTTP API in-process: SGLang's bodies, status codes and error shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from pdctl.sim.server import SimServer
from pdctl.testing.stack import free_port, in_process

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0", "PDSIM_SEED": "3"}


def run(
    mode: str,
    test: Callable[[SimServer, aiohttp.ClientSession], Awaitable[None]],
    *extra: str,
    env: dict[str, str] | None = None,
) -> None:
    async def main() -> None:
        async with (
            in_process(mode, {**FAST, **(env or {})}, *extra) as server,
            aiohttp.ClientSession(server.url) as http,
        ):
            await test(server, http)

    asyncio.run(asyncio.wait_for(main(), 30))


async def post(http: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, str) else json.dumps(body)
    async with http.post(path, data=data, headers={"Content-Type": "application/json"}) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text and not text.startswith("data:") else text)


def test_openai_errors() -> None:
    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        status, body = await post(http, "/v1/chat/completions", "{oops")
        assert status == 400
        assert body["object"] == "error" and body["type"] == "Bad Request" and body["code"] == 400
        assert "'type': 'json_invalid'" in body["message"]

        status, body = await post(
            http, "/v1/chat/completions", {"messages": [], "max_tokens": "many"}
        )
        assert status == 400 and "'type': 'int_parsing'" in body["message"]

        status, body = await post(http, "/v1/chat/completions", {"model": "sim"})
        assert status == 400 and "'loc': ('body', 'messages')" in body["message"]

        status, body = await post(http, "/v1/completions", {"prompt": "x" * 40000})
        assert status == 400
        assert body == {
            "object": "error",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
            "message": "The input (10000 tokens) is longer than the model's "
            "context length (8192 tokens).",
        }

    run("null", t)


def test_generate_errors_and_output() -> None:
    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        status, body = await post(http, "/generate", [1, 2])
        assert (status, body) == (
            400,
            {"error": "invalid type: sequence, expected struct GenerateRequest"},
        )
        # The JSON contract check's wording (verified against sglang.api.v1.api_types).
        status, body = await post(
            http, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": "x"}}
        )
        assert (status, body) == (400, {"error": 'invalid type: string "x", expected i64'})
        status, body = await post(
            http, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 9000}}
        )
        assert status == 400 and body["error"]["message"].startswith(
            "Requested token count exceeds the model's maximum context length of 8192 tokens."
        )

        status, body = await post(
            http,
            "/generate",
            {
                "text": "hello",
                "sampling_params": {"max_new_tokens": 5},
                "rid": "r1",
                "unknown_field": True,
            },
        )
        assert status == 200
        assert len(body["text"].split()) == 5
        meta = body["meta_info"]
        assert meta["id"] == "r1"
        assert meta["finish_reason"] == {"type": "length", "length": 5}
        assert (meta["prompt_tokens"], meta["completion_tokens"]) == (2, 5)
        # Same seed and rid, same text.
        _, again = await post(
            http,
            "/generate",
            {"text": "hello", "sampling_params": {"max_new_tokens": 5}, "rid": "r1"},
        )
        assert again["text"] == body["text"]

    run("null", t)


def test_streams_end_with_done_and_chat_defaults_to_eos() -> None:
    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        _, text = await post(
            http,
            "/generate",
            {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 3}},
        )
        chunks = [c[len("data: ") :] for c in text.split("\n\n") if c]
        assert chunks[-1] == "[DONE]"
        last = json.loads(chunks[-2])
        assert last["meta_info"]["finish_reason"]["type"] == "length"
        assert len(last["text"].split()) == 3  # cumulative text, as SGLang streams it

        status, body = await post(
            http, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
        )
        assert status == 200
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 16  # PDSIM_OUTPUT_TOKENS

    run("null", t, env={"PDSIM_OUTPUT_TOKENS": "16"})


def test_pd_request_without_bootstrap_room() -> None:
    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        status, body = await post(http, "/generate", {"text": "x", "rid": "abc"})
        assert (status, body) == (
            400,
            {
                "error": {
                    "message": (
                        "Invalid request: Disaggregated request received without bootstrap "
                        "room id. req.rid='abc'"
                    )
                }
            },
        )
        # A stream answers 200 first, then carries the error chunk (serving_chat).
        status, text = await post(
            http,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
        assert status == 200
        err = json.loads(text.split("\n\n")[0][len("data: ") :])["error"]
        assert (err["object"], err["type"], err["code"]) == ("error", "BAD_REQUEST", 400)
        assert text.rstrip().endswith("data: [DONE]")

    run("decode", t)


def test_health_info_and_no_metrics_without_flag() -> None:
    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        for path in ("/health", "/health_generate"):
            async with http.get(path) as r:
                assert r.status == 200
        async with http.get("/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "sim"
        async with http.get("/server_info") as r:
            info = await r.json()
            assert info["disaggregation_mode"] == "decode"
            assert info["cuda_graph_bs_decode"] == [1, 2, 4, 8, 12, 16]
        async with http.get("/model_info") as r:
            assert (await r.json())["disaggregation_mode"] == "decode"
        async with http.get("/metrics") as r:
            assert r.status == 404
        async with http.get("/v1/loads") as r:
            load = (await r.json())["loads"][0]
            assert load["disaggregation"]["mode"] == "decode"
            assert load["num_running_reqs"] == 0
        async with http.post("/flush_cache") as r:
            assert r.status == 200 and (await r.text()).startswith("Cache flushed.")
        server.status = "stopping"
        async with http.get("/health") as r:
            assert r.status == 503

    run("decode", t, "--cuda-graph-max-bs-decode", "16")


def test_health_is_503_while_starting() -> None:
    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        server.status = "starting"
        async with http.get("/health_generate") as r:
            assert r.status == 503

    run("null", t)


def test_same_seed_same_request_sequence_same_text() -> None:
    texts: list[list[str]] = []

    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        out = []
        for _ in range(3):
            _, body = await post(http, "/v1/completions", {"prompt": "hi", "max_tokens": 6})
            out.append(body["choices"][0]["text"])
        texts.append(out)

    run("null", t)
    run("null", t)
    assert texts[0] == texts[1]
    assert len(set(texts[0])) == 3


def test_page_size_mismatch_fails_the_handshake() -> None:
    async def main() -> None:
        bootstrap_port = free_port()
        async with (
            in_process("prefill", FAST, "--page-size", "64", bootstrap_port=bootstrap_port),
            in_process("decode", FAST, "--page-size", "1") as decode,
            aiohttp.ClientSession(decode.url) as http,
        ):
            status, body = await post(http, "/generate", {
                "text": "x", "bootstrap_host": "127.0.0.1",
                "bootstrap_port": bootstrap_port, "bootstrap_room": 9})  # fmt: skip
            assert status == 500
            assert body["message"].endswith(
                "KVTransferError(bootstrap_room=9): Page size mismatch: prefill server has "
                "page_size=64, but decode server has page_size=1. Both servers must use the "
                "same --page-size value."
            )

    asyncio.run(asyncio.wait_for(main(), 30))
