"""The sglang driver counts failures by pdctl's rule: judged_bench_serving.py around a stand-in
for sglang 0.5.23's bench_serving, against planted streams.

The stand-in keeps what decides bench_serving's verdict (`sglang/benchmark/serving.py`): its
chat parser skips chunks without `choices` and calls any stream that ends a success, with the
asked length unless usage arrived; its completions parser indexes `choices[0]` of every chunk
(an error chunk or a usage-only chunk raises, which it records as a failure).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pdctl.bench.sglang_driver import JUDGE

FAKE_SERVING = """
import argparse, asyncio, json
from dataclasses import dataclass, field
import aiohttp

args = None

@dataclass
class RequestFuncInput:
    prompt: str
    api_url: str
    output_len: int
    extra_request_body: dict

@dataclass
class RequestFuncOutput:
    success: bool = False
    error: str = ""
    output_len: int = 0
    generated_text: str = ""

def _create_bench_client_session():
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

async def _post(inp, payload, on_chunk):
    out = RequestFuncOutput()
    payload["ignore_eos"] = not args.disable_ignore_eos
    payload.update(inp.extra_request_body)
    output_len = inp.output_len
    try:
        async with _create_bench_client_session() as session:
            async with session.post(url=inp.api_url, json=payload) as response:
                if response.status == 200:
                    async for chunk_bytes in response.content:
                        chunk_bytes = chunk_bytes.strip()
                        if not chunk_bytes:
                            continue
                        chunk = chunk_bytes.decode().removeprefix("data: ")
                        if chunk == "[DONE]":
                            continue
                        output_len = on_chunk(json.loads(chunk), out, output_len)
                    out.success = True
                    out.output_len = output_len
                else:
                    out.error = (response.reason or "") + ": " + (await response.text())
    except Exception as e:
        out.error = repr(e)
    return out

def _chat_chunk(data, out, output_len):
    output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
    choices = data.get("choices") or []
    if choices:
        out.generated_text += (choices[0].get("delta") or {}).get("content") or ""
    return output_len

def _completion_chunk(data, out, output_len):
    if data["choices"][0]["text"]:
        out.generated_text += data["choices"][0]["text"]
        output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
    return output_len

async def async_request_openai_chat_completions(request_func_input, pbar=None):
    payload = {"messages": [{"role": "user", "content": request_func_input.prompt}],
               "max_completion_tokens": request_func_input.output_len, "stream": True}
    return await _post(request_func_input, payload, _chat_chunk)

async def async_request_openai_completions(request_func_input, pbar=None):
    payload = {"prompt": request_func_input.prompt, "best_of": 1,
               "max_tokens": request_func_input.output_len, "stream": True}
    return await _post(request_func_input, payload, _completion_chunk)

ASYNC_REQUEST_FUNCS = {
    "sglang-oai": async_request_openai_completions,
    "sglang-oai-chat": async_request_openai_chat_completions,
}

def run_benchmark(args_):
    global args
    args = args_
    func = ASYNC_REQUEST_FUNCS[args.backend]
    path = "/v1/chat/completions" if args.backend.endswith("chat") else "/v1/completions"
    extra = json.loads(args.extra_request_body or "{}")

    def inp(prompt):
        return RequestFuncInput(prompt, args.base_url + path, args.random_output_len, extra)

    async def run():
        for _ in range(args.warmup_requests):
            await func(request_func_input=inp("ok"), pbar=None)
        return [await func(request_func_input=inp(p), pbar=None) for p in args.prompts.split(",")]

    outputs = asyncio.run(run())
    with open(args.output_file, "a") as f:
        ok = [o for o in outputs if o.success]
        result = {"completed": len(ok), "total_output_tokens": sum(o.output_len for o in ok)}
        f.write(json.dumps(result) + "\\n")

def cli_main():
    p = argparse.ArgumentParser()
    for name in ("--backend", "--base-url", "--prompts", "--output-file", "--extra-request-body"):
        p.add_argument(name)
    p.add_argument("--random-output-len", type=int)
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--disable-ignore-eos", action="store_true")
    run_benchmark(p.parse_args())
"""

WANTED = 4


def _sse(chat: bool, name: str, include_usage: bool) -> tuple[int, list[str]]:
    """The planted answer for prompt `name`: HTTP status and SSE lines."""

    def chunk(text: str = "", finish: str | None = None) -> str:
        content = {"delta": {"content": text}} if chat else {"text": text}
        choice = {"index": 0, **content, "finish_reason": finish}
        return json.dumps({"choices": [choice]})

    usage = json.dumps({"choices": [], "usage": {"completion_tokens": WANTED}})
    error = {"object": "error", "message": "KVTransferError: prefill lost", "code": 500}
    tokens = [chunk("tok") for _ in range(WANTED)]
    plants = {
        "ok": [*tokens, chunk(finish="length"), *([usage] if include_usage else []), "[DONE]"],
        "error": [*tokens[:2], json.dumps({"error": error}), "[DONE]"],
        "cut": tokens[:2],  # the decode died: the stream just ends
        "short": [*tokens[:2], chunk(finish="stop"), "[DONE]"],
    }
    if name == "status":
        return 500, []
    return 200, plants[name]


class Planted(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Planted.bodies.append(body)
        chat = "messages" in body
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        status, lines = _sse(chat, prompt, usage)
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"".join(f"data: {line}\n\n".encode() for line in lines))

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def planted() -> Iterator[str]:
    Planted.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Planted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang" / "benchmark"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serving.py").write_text(FAKE_SERVING)
    return tmp_path / "site"


def _bench(
    site: Path, url: str, out: Path, backend: str, *extra: str, judged: bool = True
) -> dict[str, Any]:
    runner = (
        [str(JUDGE)]
        if judged
        else ["-c", "from sglang.benchmark import serving as s; s.cli_main()"]
    )
    args = ["--backend", backend, "--base-url", url, "--prompts", "ok,error,cut,short,status",
            "--random-output-len", str(WANTED), "--output-file", str(out), *extra]  # fmt: skip
    r = subprocess.run(
        [sys.executable, *runner, *args],
        env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    result: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return result


@pytest.mark.parametrize("backend", ["sglang-oai-chat", "sglang-oai"])
def test_only_streams_that_pass_the_rule_are_completed(
    fake_sglang: Path, planted: str, tmp_path: Path, backend: str
) -> None:
    # bench_serving alone: the chat parser passes the in-band error, the cut and the short
    # stream; the completions parser fails only the error chunk (it indexes choices[0]).
    alone = _bench(fake_sglang, planted, tmp_path / "alone.jsonl", backend, judged=False)
    assert alone["completed"] == (4 if backend == "sglang-oai-chat" else 3)

    out = tmp_path / "judged.jsonl"
    result = _bench(fake_sglang, planted, out, backend)
    assert result == {"completed": 1, "total_output_tokens": WANTED}  # "ok", nothing else
    errors = json.loads(Path(f"{out}.failures.json").read_text())["errors"]
    assert len(errors) == 4
    assert "error in the stream: KVTransferError: prefill lost" in errors[0]
    assert errors[1] == "stream ended without a finish reason after 2 tokens"
    assert errors[2] == "short: 2 of 4 tokens (finish_reason stop)"
    assert errors[3].startswith("Internal Server Error: ")  # bench_serving's own verdict
    # The judge asked for usage; the completions parser never saw the usage-only chunk.
    assert all(b["stream_options"] == {"include_usage": True} for b in Planted.bodies[-6:])


def test_without_ignore_eos_a_short_stream_with_a_finish_passes(
    fake_sglang: Path, planted: str, tmp_path: Path
) -> None:
    out = tmp_path / "eos.jsonl"
    result = _bench(fake_sglang, planted, out, "sglang-oai-chat", "--disable-ignore-eos")
    assert result["completed"] == 2  # "ok" and "short"
    errors = json.loads(Path(f"{out}.failures.json").read_text())["errors"]
    assert [e.split(":")[0] for e in errors] == [
        "error in the stream",
        "stream ended without a finish reason after 2 tokens",
        "Internal Server Error",
    ]
