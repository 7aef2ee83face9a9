"""pdctl.sim HTTP API in-process: SGLang's bodies, status codes and error shapes."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pdctl.ops.health import in_flight, probe_engine
from pdctl.sim.protocol import Parsed
from pdctl.sim.sampling import EOS_TOKEN_ID, Sampler, SamplingParams
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
        # A stream answers 200 first, then carries the error chunk (serving_chat,
        # create_streaming_error_response).
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


# ----- OpenAI sampling fidelity: n, logprobs, stop, stop_token_ids, ignore_eos, seed -----
CHAT = {"messages": [{"role": "user", "content": "tell me a story"}]}


def sse(text: str) -> list[Any]:
    """The JSON chunks of an SSE body, checking it ends with [DONE]."""
    frames = [f[len("data: ") :] for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_n_gives_n_choices_with_summed_usage() -> None:
    async def t(__: SimServer, http: aiohttp.ClientSession) -> None:
        _, body = await post(http, "/v1/chat/completions", {**CHAT, "n": 3, "max_tokens": 4})
        choices = body["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2]
        assert all(len(c["message"]["content"].split()) == 4 for c in choices)
        assert len({c["message"]["content"] for c in choices}) == 3  # distinct samples
        assert body["usage"]["prompt_tokens"] == 6  # once per prompt (UsageProcessor)
        assert body["usage"]["completion_tokens"] == 12
        assert body["metadata"] == {"weight_version": "default"}

        _, body = await post(http, "/v1/completions", {"prompt": "hi", "n": 2, "max_tokens": 3})
        assert [c["index"] for c in body["choices"]] == [0, 1]
        assert body["usage"]["completion_tokens"] == 6

        _, text = await post(
            http,
            "/v1/chat/completions",
            {**CHAT, "n": 2, "max_tokens": 3, "stream": True,
             "stream_options": {"include_usage": True}},
        )  # fmt: skip
        chunks = sse(text)
        for i in (0, 1):
            mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
            assert mine[0]["choices"][0]["delta"] == {
                "reasoning_content": None,
                "role": "assistant",
                "content": "",
            }
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in mine)
            assert len(content.split()) == 3
        # Finish chunks for both choices come after all content, then usage.
        finals = [c["choices"][0] for c in chunks[-3:-1]]
        assert sorted(f["index"] for f in finals) == [0, 1]
        assert all(f["finish_reason"] == "length" and f["delta"] == {"reasoning_content": None}
                   for f in finals)  # fmt: skip
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6

        status, body = await post(http, "/v1/completions", {"prompt": "hi", "n": 0})
        assert status == 400 and body["message"] == "n must be at least 1."

    run("null", t)


def test_logprobs_are_well_formed() -> None:
    async def t(__: SimServer, http: aiohttp.ClientSession) -> None:
        _, body = await post(
            http,
            "/v1/chat/completions",
            {**CHAT, "max_tokens": 5, "logprobs": True, "top_logprobs": 3},
        )
        choice = body["choices"][0]
        content = choice["logprobs"]["content"]
        assert len(content) == 5
        assert "".join(e["token"] for e in content) == choice["message"]["content"]
        for e in content:
            assert e["bytes"] == list(e["token"].encode())
            top = e["top_logprobs"]
            assert len(top) == 3 and len({x["token"] for x in top}) == 3
            assert (top[0]["token"], top[0]["logprob"]) == (e["token"], e["logprob"])
            lps = [x["logprob"] for x in top]
            assert lps == sorted(lps, reverse=True)
            assert sum(math.exp(lp) for lp in lps) < 1
        _, body = await post(http, "/v1/chat/completions", {**CHAT, "max_tokens": 2})
        assert body["choices"][0]["logprobs"] is None

        _, body = await post(
            http, "/v1/completions", {"prompt": "hi", "max_tokens": 4, "logprobs": 2}
        )
        lp = body["choices"][0]["logprobs"]
        assert lp["text_offset"] == [-1] * 4
        assert "".join(lp["tokens"]) == body["choices"][0]["text"]
        assert all(x <= 0 for x in lp["token_logprobs"])
        assert [len(d) for d in lp["top_logprobs"]] == [2] * 4
        _, body = await post(
            http, "/v1/completions", {"prompt": "hi", "max_tokens": 4, "logprobs": 0}
        )
        assert body["choices"][0]["logprobs"]["top_logprobs"] == []

        _, text = await post(
            http,
            "/v1/chat/completions",
            {**CHAT, "max_tokens": 4, "logprobs": True, "stream": True},
        )
        streamed = [
            e for c in sse(text) if c["choices"] and c["choices"][0]["logprobs"]
            for e in c["choices"][0]["logprobs"]["content"]
        ]  # fmt: skip
        assert len(streamed) == 4 and all(e["top_logprobs"] == [] for e in streamed)

    run("null", t)


def test_stop_strings_cut_the_output_before_the_stop() -> None:
    async def t(__: SimServer, http: aiohttp.ClientSession) -> None:
        base = {**CHAT, "max_tokens": 12, "seed": 11}
        _, free = await post(http, "/v1/chat/completions", base)
        full = free["choices"][0]["message"]["content"]
        words = full.split()
        assert free["choices"][0]["finish_reason"] == "length"
        assert free["choices"][0]["matched_stop"] is None
        # A stop that spans two tokens: the end of word 3 and the start of word 4.
        stop = f"{words[3][-1]} {words[4][0]}"
        cut = full[: full.find(stop)]
        tokens_until_stop = len(full[: full.find(stop) + len(stop)].split())
        for stream in (False, True):
            _, out = await post(
                http,
                "/v1/chat/completions",
                {**base, "stop": ["zzzz", stop], "stream": stream,
                 "stream_options": {"include_usage": True}},
            )  # fmt: skip
            if stream:
                chunks = sse(out)
                text = "".join(
                    c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
                )
                final = chunks[-2]["choices"][0]
                completion_tokens = chunks[-1]["usage"]["completion_tokens"]
            else:
                final = out["choices"][0]
                text = final["message"]["content"]
                completion_tokens = out["usage"]["completion_tokens"]
            assert text == cut
            assert (final["finish_reason"], final["matched_stop"]) == ("stop", stop)
            assert completion_tokens == tokens_until_stop

        _, out = await post(
            http, "/v1/completions", {"prompt": "hi", "max_tokens": 12, "seed": 11, "stop": "a"}
        )
        choice = out["choices"][0]  # the seeded text has an "a" within 12 words
        assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", "a")
        assert "a" not in choice["text"]

    run("null", t)


def test_stop_token_ids_ignore_eos_and_generate_n() -> None:
    async def t(__: SimServer, http: aiohttp.ClientSession) -> None:
        sp = {"max_new_tokens": 8, "sampling_seed": 4}
        _, free = await post(http, "/generate", {"text": "hi", "sampling_params": sp})
        ids = free["output_ids"]
        assert len(ids) == 8 and free["meta_info"]["finish_reason"]["type"] == "length"
        stop_id = ids[3]
        first = ids.index(stop_id)
        _, out = await post(
            http,
            "/generate",
            {"text": "hi", "sampling_params": {**sp, "stop_token_ids": [stop_id]}},
        )
        assert out["output_ids"] == ids[: first + 1]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
        assert out["meta_info"]["completion_tokens"] == first + 1
        assert out["text"] == "".join(f"{w} " for w in free["text"].split()[:first])
        # ignore_eos turns token stops off: exactly max_new_tokens, "length".
        _, out = await post(
            http,
            "/generate",
            {"text": "hi",
             "sampling_params": {**sp, "stop_token_ids": [stop_id], "ignore_eos": True}},
        )  # fmt: skip
        assert out["output_ids"] == ids
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 8}

        _, outs = await post(
            http,
            "/generate",
            {"text": "hi", "sampling_params": {"max_new_tokens": 3, "n": 2},
             "return_logprob": True},
        )  # fmt: skip
        assert isinstance(outs, list) and len(outs) == 2
        assert outs[0]["meta_info"]["id"] != outs[1]["meta_info"]["id"]
        for o in outs:
            logprobs = o["meta_info"]["output_token_logprobs"]
            assert [row[1] for row in logprobs] == o["output_ids"]
            assert all(row[2] is None for row in logprobs)  # no return_text_in_logprobs

        # Without max_tokens the fake model stops on its own after PDSIM_OUTPUT_TOKENS: the
        # eos id is the matched stop; ignore_eos makes the same request run to max_tokens.
        _, body = await post(http, "/v1/chat/completions", CHAT)
        assert (body["choices"][0]["finish_reason"], body["choices"][0]["matched_stop"]) == (
            "stop",
            EOS_TOKEN_ID,
        )
        _, body = await post(
            http, "/v1/chat/completions", {**CHAT, "ignore_eos": True, "max_tokens": 20}
        )
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 20

    run("null", t, env={"PDSIM_OUTPUT_TOKENS": "5"})


def test_same_seed_and_prompt_same_text() -> None:
    async def t(__: SimServer, http: aiohttp.ClientSession) -> None:
        async def text(seed: int, prompt: str, stream: bool = False) -> list[str]:
            body = {"prompt": prompt, "max_tokens": 6, "seed": seed, "n": 2, "stream": stream}
            _, out = await post(http, "/v1/completions", body)
            if stream:
                parts = ["", ""]
                for c in sse(out):
                    parts[c["choices"][0]["index"]] += c["choices"][0]["text"]
                return parts
            return [c["text"] for c in out["choices"]]

        a = await text(5, "hello")
        assert a[0] == a[1]  # same seed and prompt: each sample alike
        assert await text(5, "hello") == a
        assert await text(5, "hello", stream=True) == a
        assert await text(6, "hello") != a
        assert await text(5, "bye") != a

    run("null", t)


def test_sampler_holds_back_a_possible_stop_start() -> None:
    free = Sampler(SamplingParams(), 1, "k")
    pieces = [free.next().piece for _ in range(6)]
    full = "".join(pieces)
    stop = " " + pieces[3][0]  # spans tokens: the space ending a word, the next word's start
    sampler = Sampler(SamplingParams(stop=(stop,)), 1, "k")
    out = [sampler.next()]
    while out[-1].matched is None:
        out.append(sampler.next())
    assert out[-1].matched == stop
    assert "".join(s.visible for s in out) == full[: full.index(stop)]
    # Every word ends in the stop's first character (a space): it stays held back until
    # the next token shows the stop did not follow.
    for i in range(len(out) - 1):
        assert "".join(s.visible for s in out[: i + 1]) == "".join(pieces[: i + 1])[:-1]
    assert sampler.flush() == ""
    # Without a stop the held-back text comes out when the request ends.
    tail = Sampler(SamplingParams(stop=("zzzz",)), 1, "k")
    shown = "".join(tail.next().visible for _ in range(6))
    assert shown + tail.flush() == full


# LoadSnapshot.to_dict's keys in SGLang 0.5.23 (srt/managers/load_snapshot.py), for the
# sections the sim has; tests/parser/test_sglang_loads.py checks them against SGLang.
LOAD_CORE_KEYS = [
    "timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs",
    "num_waiting_uncached_tokens", "num_used_tokens", "num_total_tokens", "num_active_tokens",
    "num_prealloc_ready_tokens", "max_total_num_tokens", "max_running_requests", "token_usage",
    "gen_throughput", "cache_hit_rate", "utilization", "total_prefill_uncached_tokens",
    "total_prefill_busy_us", "decode_moments",
]  # fmt: skip
LOAD_SECTION_KEYS = {
    "memory": ["weight_gb", "kv_cache_gb", "graph_gb", "token_capacity"],
    "disaggregation": [
        "mode", "prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs",
        "decode_prealloc_queue_reqs", "decode_transfer_queue_reqs",
        "decode_retracted_queue_reqs", "kv_transfer_speed_gb_s", "kv_transfer_latency_ms",
    ],
    "queues": ["waiting", "grammar", "paused", "retracted", "prealloc_ready"],
}  # fmt: skip


def test_loads_count_the_bootstrap_queue_as_waiting() -> None:
    """LoadInquirer.get_loads: a prefill's requests waiting for their decode are waiting
    requests (what smg's overload protection reads), though not in the waiting queue."""

    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}, "bootstrap_port": 1}
        legs = [
            asyncio.create_task(post(http, "/generate", {**body, "bootstrap_room": room}))
            for room in (1, 2)
        ]
        while len(server.engine.bootstrap_queue) < 2:
            await asyncio.sleep(0.01)
        async with http.get("/v1/loads", params={"include": "core,disagg,queues,memory"}) as r:
            (load,) = (await r.json())["loads"]
        assert list(load) == [*LOAD_CORE_KEYS, *LOAD_SECTION_KEYS]
        for section, keys in LOAD_SECTION_KEYS.items():
            assert list(load[section]) == keys
        assert load["num_waiting_reqs"] == 2 and load["queues"]["waiting"] == 0
        # What a restart's drain waits on (smg's own load misses streamed requests).
        assert await asyncio.to_thread(in_flight, server.url) == 2
        assert await asyncio.to_thread(in_flight, f"http://127.0.0.1:{free_port()}") is None
        assert load["disaggregation"]["prefill_bootstrap_queue_reqs"] == 2
        assert load["memory"]["token_capacity"] == load["max_total_num_tokens"]
        async with http.get("/v1/loads", params={"include": "core"}) as r:
            assert list((await r.json())["loads"][0]) == LOAD_CORE_KEYS
        async with http.get("/v1/loads", params={"include": "core,gpu"}) as r:
            assert r.status == 400
            assert (await r.json())["detail"].startswith("Invalid include sections: {'gpu'}")
        for leg in legs:
            leg.cancel()

    run("prefill", t)


async def metric(http: aiohttp.ClientSession, name: str) -> float:
    """The sum of a family's samples named `name` (sglang:<name>) on /metrics."""
    async with http.get("/metrics") as r:
        text = await r.text()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == f"sglang:{name}"
    )


async def statuses(http: aiohttp.ClientSession, *paths: str) -> list[int]:
    out = []
    for path in paths:
        async with http.get(path) as r:
            out.append(r.status)
    return out


def test_ready_and_ping_follow_start_pause_health_and_shutdown() -> None:
    """http_server.ready (is_ready) and sagemaker_health (is_healthy): a paused server is
    healthy but not ready; a /health that times out while paused leaves it unhealthy
    until a check passes again."""

    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        server.status = "starting"
        assert await statuses(http, "/ready", "/ping", "/health") == [503, 503, 503]
        server.status = "up"
        assert await statuses(http, "/ready", "/ping") == [200, 200]
        assert await post(http, "/pause_generation", {"mode": "in_place"}) == (
            200,
            {"message": "Generation paused successfully.", "status": "ok"},
        )
        assert await statuses(http, "/ready", "/ping") == [503, 200]
        assert (await asyncio.to_thread(probe_engine, server.url)).paused  # pdctl's view
        # the health generate waits at the pause gate until SGLANG_HEALTH_CHECK_TIMEOUT
        assert await statuses(http, "/health", "/ready", "/ping") == [503, 503, 503]
        assert await post(http, "/continue_generation", {}) == (
            200,
            {"message": "Generation continued successfully.", "status": "ok"},
        )
        assert await statuses(http, "/ready", "/health", "/ready", "/ping") == [503, 200, 200, 200]
        server.status = "stopping"
        assert await statuses(http, "/ready", "/ping", "/health") == [503, 503, 503]

    run("null", t)


def test_pause_abort_ends_requests_in_flight_and_holds_new_ones() -> None:
    """tokenizer_manager.pause_generation, mode abort (the default): requests in flight end
    with a status-less abort (a normal answer), new ones wait until continue; each abort
    round counts once in num_aborted_requests."""

    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4000}}
        running = asyncio.create_task(post(http, "/generate", body))
        while not server.engine.running:
            await asyncio.sleep(0.005)
        assert (await post(http, "/pause_generation", {}))[0] == 200
        status, out = await running
        assert status == 200 and 0 < out["meta_info"]["completion_tokens"] < 4000
        assert out["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "Aborted",
            "status_code": None,
            "err_type": None,
        }
        assert await metric(http, "num_aborted_requests_total") == 2  # one round, a second
        held = asyncio.create_task(post(http, "/v1/completions", {"prompt": "x", "max_tokens": 3}))
        await asyncio.sleep(0.1)
        assert not held.done() and not server.tm.inflight
        assert await metric(http, "num_queue_reqs") == 0  # not in the scheduler yet
        await post(http, "/continue_generation", {})
        status, out = await held
        assert status == 200 and out["usage"]["completion_tokens"] == 3

    run("null", t, "--enable-metrics")


def test_pause_in_place_freezes_the_scheduler_and_its_gauges() -> None:
    """scheduler.pause_generation in_place: no batch runs, queues and gauges stay as they
    were; continue resumes the same requests with their KV."""

    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        # Long enough that the pause lands while it runs, however loaded the machine (300
        # tokens ended before the pause under a full suite's load).
        body = {"prompt": "hi", "max_tokens": 2000}
        req = asyncio.create_task(post(http, "/v1/completions", body))
        while not server.engine.running or server.engine.forward_ct_decode < 45:
            await asyncio.sleep(0.005)
        await post(http, "/pause_generation", {"mode": "in_place"})
        (paused,) = server.engine.running
        generated, usage = paused.generated, await metric(http, "num_used_tokens")
        assert await metric(http, "num_running_reqs") == 1
        assert await metric(http, "gen_throughput") > 0  # not zeroed: the loop stopped
        await asyncio.sleep(0.1)
        assert paused.generated == generated and not req.done()
        assert await metric(http, "num_used_tokens") == usage
        await post(http, "/continue_generation", {"torch_empty_cache": "false"})
        status, out = await req
        assert status == 200 and out["usage"]["completion_tokens"] == 2000

    run("null", t, "--enable-metrics", "--decode-log-interval", "40")


def test_pause_retract_requeues_running_requests_and_zeroes_throughput() -> None:
    """scheduler.pause_generation retract (unified): running requests go back to the waiting
    queue with their KV freed, gen_throughput reads 0 at once; on continue they are
    prefilled again and finish whole."""

    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        # Long enough that the pause lands while it runs, however loaded the machine (300
        # tokens ended before the pause under a full suite's load).
        body = {"prompt": "hi", "max_tokens": 2000}
        req = asyncio.create_task(post(http, "/v1/completions", body))
        # The pause comes while the step that logs the next stats line (every 40) runs
        # (straight to the tokenizer manager that /pause_generation calls: the HTTP hop
        # would let steps go by): the scheduler takes it once that step has ended, so that
        # line's throughput does not outlive the pause.
        while server.engine.forward_ct_decode < 79:
            await asyncio.sleep(0)
        assert server.engine.forward_ct_decode == 79
        await server.tm.pause_generation("retract")
        assert server.engine.forward_ct_decode == 80  # that step ended, and no other runs
        await asyncio.sleep(0.1)
        assert server.engine.forward_ct_decode == 80
        assert [await metric(http, n) for n in ("num_running_reqs", "num_queue_reqs")] == [0, 1]
        assert await metric(http, "gen_throughput") == 0
        assert server.engine.pool.used == 0 and server.engine.busy
        await post(http, "/continue_generation", {})
        status, out = await req
        assert status == 200 and out["usage"]["completion_tokens"] == 2000
        assert server.engine.pool.used == 0

    run("null", t, "--enable-metrics", "--decode-log-interval", "40")


def test_pause_retract_on_a_decode_holds_running_requests_out_of_every_queue() -> None:
    async def t(server: SimServer, http: aiohttp.ClientSession) -> None:
        engine = server.decode_engine
        assert engine is not None
        req = engine_req(server, 50)
        engine.running.append(req)
        engine.pool.try_reserve(req.reserved)
        server.tm.inflight.add(req)
        await post(http, "/pause_generation", {"mode": "retract"})
        assert engine.held_for_rebootstrap == [req] and not engine.running
        assert engine.pool.used == 0 and not engine.disagg_queues()
        await post(http, "/continue_generation", {})
        assert not engine.held_for_rebootstrap
        assert engine.retracted == [req] or req in engine.running or req.done

    run("decode", t)


def engine_req(server: SimServer, generated: int) -> Any:
    """A request the decode runs, `generated` tokens in, holding their KV."""
    p = Parsed(10, "", 100, False, "r1", None, None, 7, False, "sim")
    req = server.tm.new_req(p)
    req.generated, req.reserved, req.admitted = generated, 10 + generated, 0.0
    return req


def test_pause_and_continue_bodies_are_validated_as_fastapi_does() -> None:
    async def t(_: SimServer, http: aiohttp.ClientSession) -> None:
        async with http.post("/pause_generation") as r:
            assert r.status == 400
            err = await r.json()
        assert err["type"] == "Bad Request" and err["code"] == 400
        assert err["message"] == (
            "[{'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}]"
        )
        status, err = await post(http, "/pause_generation", {"mode": "drain"})
        assert status == 400 and err["message"] == (
            "[{'type': 'literal_error', 'loc': ('body', 'mode'), 'msg': \"Input should be "
            "'abort', 'retract' or 'in_place'\", 'input': 'drain', 'ctx': {'expected': "
            "\"'abort', 'retract' or 'in_place'\"}}]"
        )
        status, err = await post(http, "/continue_generation", {"torch_empty_cache": "maybe"})
        assert status == 400 and "'bool_parsing'" in err["message"]
        status, err = await post(http, "/pause_generation", [])
        assert status == 400 and "'dict_type'" in err["message"]
        async with http.get("/pause_generation") as r:
            assert r.status == 405
        # nothing paused on the way
        assert await statuses(http, "/ready") == [200]

    run("null", t)
