"""pdctl bench: metric definitions, the builtin driver against a fake SSE server, sweep, compare."""

from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from click.testing import CliRunner

from pdctl.bench.builtin import arrival_times
from pdctl.bench.client import RequestOutput
from pdctl.bench.compare import compare
from pdctl.bench.level import Level, Target, build_levels, default_num_prompts
from pdctl.bench.metrics import calculate
from pdctl.bench.prompts import random_prompts
from pdctl.bench.results import load, tpot_fit, write_atomic
from pdctl.bench.sampler import parse_sample
from pdctl.bench.sglang_driver import JUDGE
from pdctl.bench.sweep import SweepOptions, run_sweep
from pdctl.cli import cli
from pdctl.cli.bench_commands import sweep_target
from pdctl.errors import PdctlError
from pdctl.spec import Role, load_deployment
from pdctl.testing.stack import constant_load, wait_until
from tests.conftest import CACHE, require_path

# --- metric definitions, by hand ------------------------------------------------------------


def _outputs() -> list[RequestOutput]:
    return [
        RequestOutput(True, 0.2, 0.1, [0.02, 0.02, 0.04], 10, 4, 0.0),
        RequestOutput(True, 0.5, 0.3, [0.1], 20, 2, 0.05),
        RequestOutput(False, 0.0, 0.0, [], 30, 0, 0.1, "HTTP 500"),
    ]


def test_metrics_match_hand_computed_values() -> None:
    m = calculate(_outputs(), duration=1.0)
    expected = {
        "completed": 2,
        "total_input_tokens": 30,  # failed requests count no input, as in bench_serving
        "total_output_tokens": 6,
        "request_throughput": 2.0,
        "output_throughput": 6.0,
        "total_throughput": 36.0,
        "mean_ttft_ms": 200.0,
        "median_ttft_ms": 200.0,
        "std_ttft_ms": 100.0,
        "p90_ttft_ms": 280.0,
        "p99_ttft_ms": 298.0,
        # TPOT excludes the first token: (0.2-0.1)/3 and (0.5-0.3)/1
        "mean_tpot_ms": (100 / 3 + 200) / 2,
        "std_tpot_ms": (200 - 100 / 3) / 2,
        # ITL pools every gap: 20, 20, 40, 100 ms
        "mean_itl_ms": 45.0,
        "median_itl_ms": 30.0,
        "p90_itl_ms": 82.0,
        "p99_itl_ms": 98.2,
        "mean_e2e_latency_ms": 350.0,
        "p99_e2e_latency_ms": 497.0,
        "concurrency": 0.7,
        "max_output_tokens_per_s": 6.0,
        "max_concurrent_requests": 2,
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(value), key


@dataclass
class _Tok:
    @staticmethod
    def encode(text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


@pytest.mark.parser
def test_metrics_equal_bench_serving_own_calculate_metrics() -> None:
    """Run sglang 0.5.23's calculate_metrics (lifted from its source) on the same outputs."""
    site = CACHE / "sglang-parser" / "lib" / "python3.11" / "site-packages"
    source = require_path(site / "sglang" / "benchmark" / "serving.py", "sglang source").read_text()
    wanted = {"RequestFuncOutput", "BenchmarkMetrics", "calculate_metrics"}
    tree = ast.parse(source)
    body = [n for n in tree.body if getattr(n, "name", None) in wanted]
    ns: dict[str, Any] = {}
    exec(
        "from __future__ import annotations\nimport warnings\nfrom dataclasses import "
        "dataclass, field\nfrom typing import *\nimport numpy as np\n"
        "TERM_PLOTLIB_AVAILABLE = False\n" + ast.unparse(ast.Module(body=body, type_ignores=[])),
        ns,
    )
    rng = np.random.default_rng(3)
    ours, theirs, rows = [], [], []
    for i in range(40):
        n_out = int(rng.integers(1, 30))
        itl = [float(x) for x in rng.uniform(0.005, 0.05, n_out - 1)]
        ttft = float(rng.uniform(0.05, 0.5))
        start = float(rng.uniform(0, 3))
        ok = i % 7 != 3
        latency = ttft + sum(itl) + 0.001
        ours.append(RequestOutput(ok, latency, ttft, itl, 50 + i, n_out, start))
        t = ns["RequestFuncOutput"](
            generated_text="w " * n_out, success=ok, latency=latency, ttft=ttft, itl=itl,
            prompt_len=50 + i, output_len=n_out, start_time=start,
        )  # fmt: skip
        theirs.append(t)
        rows.append(type("Row", (), {"prompt_len": 50 + i, "text_prompt_len": 50 + i,
                                     "vision_prompt_len": 0}))  # fmt: skip
    ref, _ = ns["calculate_metrics"](rows, theirs, 4.2, _Tok(), "sglang-oai")
    mine = calculate(ours, 4.2)
    # benchmark() renames these when it writes the result line; duration is its own argument
    mapping = {f"total_{k}_tokens": f"total_{k}" for k in ("input", "output")} | {
        f"total_input_{k}_tokens": f"total_input_{k}" for k in ("text", "vision")
    }
    assert {mapping.get(k, k) for k in mine} - set(vars(ref)) == {"duration"}
    for key, value in mine.items():
        if key != "duration":
            assert value == pytest.approx(float(getattr(ref, mapping.get(key, key)))), key


# --- a tiny deterministic SGLang-like server --------------------------------------------------

TTFT_S = 0.05
ITL_S = 0.01


@dataclass
class FakeServer:
    url: str
    state: dict[str, Any]


def _metrics_text(state: dict[str, Any]) -> str:
    lbl = 'engine_type="decode",model_name="fake",tp_rank="0",pp_rank="0"'
    return (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        f"sglang:num_running_reqs{{{lbl}}} {state['inflight']}\n"
        "# HELP sglang:is_cuda_graph Whether batch is using CUDA graph.\n"
        "# TYPE sglang:is_cuda_graph gauge\n"
        f"sglang:is_cuda_graph{{{lbl}}} 1.0\n"
        "# HELP sglang:token_usage The token usage.\n"
        "# TYPE sglang:token_usage gauge\n"
        f"sglang:token_usage{{{lbl}}} {0.01 * state['inflight']}\n"
        "# HELP sglang:cuda_graph_passes_total Passes.\n"
        "# TYPE sglang:cuda_graph_passes_total counter\n"
        f'sglang:cuda_graph_passes_total{{{lbl},mode="decode_none"}} {state["requests"]}\n'
    )


def _app(state: dict[str, Any]) -> web.Application:
    @web.middleware
    async def keyed(request: web.Request, handler: Any) -> web.StreamResponse:
        """With state["api_key"], the /v1 routes want it, as smg with --api-key does."""
        auth = request.headers.get("Authorization")
        state["auth"].append((request.path, auth))
        key = state["api_key"]
        if key and request.path.startswith("/v1/") and auth != f"Bearer {key}":
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=_metrics_text(state))

    async def generate(request: web.Request) -> web.StreamResponse:
        """Streams max_tokens text chunks, a finish reason and (when asked) a usage chunk.
        Every `fail_every`-th request goes wrong the `fault` way: "http" (500), "error" (an
        in-band error event after two tokens, as SGLang sends it), "no_finish" (the stream
        ends after all tokens without a finish reason), "short" (finish reason and usage
        one token short)."""
        body = await request.json()
        state["requests"] += 1
        state["bodies"].append(body)
        fault = state["fail_every"] and state["requests"] % state["fail_every"] == 0
        fault = fault and state["fault"]
        if fault == "http":
            return web.json_response({"error": "boom"}, status=500)
        chat = request.path.endswith("chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state["inflight"] += 1
        try:
            n = int(body["max_tokens"]) - (fault == "short")

            async def send(data: dict[str, Any]) -> None:
                await resp.write(f"data: {json.dumps(data)}\n\n".encode())

            def text(t: str, finish: str | None = None) -> dict[str, Any]:
                choice = {"delta": {"content": t}} if chat else {"text": t}
                return {"choices": [{**choice, "finish_reason": finish}], "usage": None}

            await send(text(""))  # a role/header chunk without text: not the first token
            await asyncio.sleep(TTFT_S)
            for i in range(n):
                if i:
                    await asyncio.sleep(ITL_S)
                if fault == "error" and i == 2:
                    err = {"object": "error", "message": "Lost connection with prefill",
                           "type": "INTERNAL_SERVER_ERROR", "param": None, "code": 500}  # fmt: skip
                    await send({"error": err})
                    break
                await send(text("tok "))
            else:
                if fault != "no_finish":
                    await send(text("", "length"))
                    if (body.get("stream_options") or {}).get("include_usage"):
                        await send({"choices": [], "usage": {"completion_tokens": n}})
            await resp.write(b"data: [DONE]\n\n")
        finally:
            state["inflight"] -= 1
        return resp

    app = web.Application(middlewares=[keyed])
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    state: dict[str, Any] = {
        "inflight": 0, "requests": 0, "bodies": [], "fail_every": 0, "fault": "http",
        "api_key": None, "auth": [],
    }  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(state))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield FakeServer(f"http://127.0.0.1:{port}", state)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _sweep(
    server: FakeServer, levels: list[Level], out: Path | None = None, **kw: Any
) -> list[dict]:
    endpoint, key = kw.pop("endpoint", "completions"), kw.pop("api_key", None)
    target = Target(server.url, "", endpoint, (server.url + "/metrics",), key)
    opts = SweepOptions(sample_interval_s=0.05, **kw)
    return asyncio.run(run_sweep(target, levels, opts, output_file=out))


def test_builtin_driver_timings_against_fake_server(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    out_len = 10
    levels = build_levels("1,4", "4,8", 32, out_len, 1.0, seed=5)
    rows = _sweep(fake_server, levels, tmp_path / "out.jsonl")
    assert [r["max_concurrency"] for r in rows] == [1, 4]
    for r in rows:
        assert r["completed"] == r["num_prompts"] and r["failed"] == 0
        assert r["total_output_tokens"] == out_len * r["completed"]
        assert r["total_input_tokens"] == 32 * r["completed"]
        # The server sleeps TTFT_S before the first text and ITL_S between texts, so no
        # first text can arrive sooner and no last one before their sum: floors. How close
        # the figures come to them depends on the machine's load, a benchmark's question
        # (a loaded CI machine measured a TTFT of 234 ms for these 50).
        ttft, itl = 1000 * TTFT_S, 1000 * ITL_S
        assert r["median_ttft_ms"] >= ttft  # every request's is
        assert r["median_e2e_latency_ms"] >= ttft + (out_len - 1) * itl
        assert r["median_itl_ms"] > 0 and r["mean_tpot_ms"] > 0
        # TPOT spreads the post-first-token time over the remaining tokens
        tpot_e2e = r["mean_ttft_ms"] + (out_len - 1) * r["mean_tpot_ms"]
        assert r["mean_e2e_latency_ms"] == pytest.approx(tpot_e2e, rel=0.01)
        assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration"])
        assert r["server"]["samples"] >= 1
    assert rows[1]["server"]["num_running_reqs"]["max"] <= 4
    # one warm-up per level plus the canary, like bench_serving's warm-up
    assert fake_server.state["requests"] == 1 + (1 + 4) + (1 + 8)
    body = fake_server.state["bodies"][-1]
    assert body["ignore_eos"] is True and body["stream"] is True and body["temperature"] == 0.0
    assert body["model"] == "fake-model" and body["max_tokens"] == out_len


def test_sweep_writes_bench_serving_fields(fake_server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    _sweep(fake_server, build_levels("2", "4", 16, 4, 1.0, 1), out)
    (row,) = load(out)
    fields = {
        "backend", "dataset_name", "request_rate", "max_concurrency", "random_input_len",
        "random_output_len", "random_range_ratio", "duration", "completed", "total_input_tokens",
        "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
        "total_throughput", "concurrency", "max_output_tokens_per_s", "max_concurrent_requests",
    } | {
        f"{stat}_{name}_ms"
        for stat in ("mean", "median", "std", "p90", "p95", "p99")
        for name in ("ttft", "tpot", "itl", "e2e_latency")
    }  # fmt: skip
    assert fields <= row.keys()
    assert row["backend"] == "sglang-oai" and math.isinf(row["request_rate"])
    assert not list(tmp_path.glob(".*tmp"))  # the temp file was renamed away


def test_chat_endpoint_streams_with_usage_and_ignore_eos(fake_server: FakeServer) -> None:
    (row,) = _sweep(fake_server, build_levels("2", "2", 8, 6, 1.0, 1), endpoint="chat")
    assert row["total_output_tokens"] == 2 * 6 and row["failed"] == 0
    assert row["backend"] == "sglang-oai-chat"
    body = fake_server.state["bodies"][-1]
    assert "messages" in body
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 6
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("http", "HTTP 500"),
        ("error", "error in the stream: Lost connection with prefill"),
        ("no_finish", "stream ended without a finish reason after 3 tokens"),
        ("short", "short: 2 of 3 tokens (finish_reason length)"),
    ],
)
def test_failed_requests_are_counted(fake_server: FakeServer, fault: str, error: str) -> None:
    # canary = request 1, warm-up = 2; then every 3rd request fails
    fake_server.state.update(fail_every=3, fault=fault)
    (row,) = _sweep(fake_server, build_levels("2", "9", 8, 3, 1.0, 1))
    assert row["failed"] == 3 and row["completed"] == 6
    assert row["errors"][0].startswith(error), row["errors"]


@pytest.mark.parametrize(
    ("fault", "status", "failure"),
    [
        ("http", 500, "HTTP 500"),
        ("error", 200, "error in the stream: Lost connection with prefill"),
        ("no_finish", 200, "stream ended without a finish reason after 4 tokens"),
        ("short", 200, "short: 3 of 4 tokens (finish_reason length)"),
    ],
)
def test_constant_load_fails_requests_by_the_same_rule(
    fake_server: FakeServer, fault: str, status: int, failure: str
) -> None:
    fake_server.state.update(fail_every=2, fault=fault)
    with constant_load(fake_server.url, clients=1, max_tokens=4, timeout=10) as outcomes:
        wait_until(lambda: len(outcomes) >= 6, 30, "six load requests")
    body = fake_server.state["bodies"][0]
    assert body["stream"] and body["ignore_eos"] and body["messages"]
    # Requests alternate: odd ones pass, every 2nd goes wrong the `fault` way.
    assert all(o.ok and o.status == 200 for o in outcomes[0:6:2])
    bad = outcomes[1:6:2]
    assert all(o.status == status and o.failure and o.failure.startswith(failure) for o in bad)


def test_canary_failure_is_clear(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.state["fail_every"] = 1
    out = tmp_path / "never.jsonl"
    with pytest.raises(PdctlError, match=r"canary request .* failed: HTTP 500"):
        _sweep(fake_server, build_levels("1", "2", 8, 3, 1.0, 1), out)
    assert not out.exists()


def test_level_timeout_keeps_completed_levels(fake_server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "partial.jsonl"
    levels = [*build_levels("1", "1", 8, 2, 1.0, 1), *build_levels("1", "1", 8, 400, 1.0, 2)]
    start = time.monotonic()
    with pytest.raises(PdctlError, match="did not finish in 1 s"):
        _sweep(fake_server, levels, out, timeout_s=1.0)
    assert time.monotonic() - start < 10
    assert [r["random_output_len"] for r in load(out)] == [2]


def test_prompts_are_deterministic_and_sized() -> None:
    a = random_prompts(5, 64, 32, 0.5, seed=9)
    assert a == random_prompts(5, 64, 32, 0.5, seed=9)
    assert a != random_prompts(5, 64, 32, 0.5, seed=10)
    assert all(32 <= p.prompt_len <= 64 and 16 <= p.output_len <= 32 for p in a)
    assert all(len(p.text.split()) == p.prompt_len for p in a)
    # four characters a word with its space: pdctl.sim's ceil(chars/4) tokenizer agrees
    assert all(math.ceil((len(p.text) + 1) / 4) == p.prompt_len for p in a)


def test_default_prompt_counts_follow_the_seed() -> None:
    assert [default_num_prompts(c) for c in (1, 16, 64)] == [8, 48, 96]
    assert default_num_prompts(256) == 384


def test_parse_sample_aggregates_engines() -> None:
    state = {"inflight": 3, "requests": 7}
    s = parse_sample([_metrics_text(state), _metrics_text({"inflight": 5, "requests": 1})])
    assert s.num_running_reqs == 8 and s.is_cuda_graph == 1.0
    assert s.token_usage == pytest.approx(0.05) and s.eager_passes == 8


def test_parse_sample_counts_eager_passes_once_per_engine_not_per_tp_rank() -> None:
    text = "".join(
        f'sglang:cuda_graph_passes_total{{mode="decode_none",tp_rank="{r}"}} 6\n' for r in range(4)
    )
    assert parse_sample([text, text]).eager_passes == 12


def _row(c: int, tput: float, tpot: float) -> dict[str, Any]:
    return {
        "max_concurrency": c, "completed": 8, "output_throughput": tput, "mean_tpot_ms": tpot,
        "median_ttft_ms": 300.0, "p99_itl_ms": tpot * 2, "median_e2e_latency_ms": 1000.0,
    }  # fmt: skip


def test_tpot_fit_recovers_law() -> None:
    rows = [_row(c, 0, 40 + 30 * c) for c in (1, 16, 64)]
    fit = tpot_fit(rows)
    assert fit is not None
    assert fit.a == pytest.approx(40) and fit.b == pytest.approx(30)
    assert fit.asymptote_tps == pytest.approx(1000 / 30)


def test_compare_cli(tmp_path: Path) -> None:
    a, b = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    write_atomic(a, [_row(1, 11.5, 84.0), _row(16, 29.0, 536.0)])
    write_atomic(b, [_row(1, 50.0, 19.0), _row(16, 400.0, 35.0), _row(64, 700.0, 85.0)])
    levels = compare(load(a), load(b))
    assert [lv.concurrency for lv in levels] == [1, 16, 64]
    tput = levels[0].deltas[0]
    assert tput.pct == pytest.approx(100 * (50 - 11.5) / 11.5) and tput.better is True
    assert levels[1].deltas[2].better is True  # lower TPOT is better
    assert levels[2].deltas[0].before is None and levels[2].deltas[0].pct is None

    result = CliRunner().invoke(cli, ["bench", "compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "before.jsonl → after.jsonl" in result.output
    assert "+334.8%" in result.output and "-93.5%" in result.output
    as_json = CliRunner().invoke(cli, ["bench", "compare", str(a), str(b), "--format", "json"])
    out = json.loads(as_json.output)
    assert out["levels"][1]["mean_tpot_ms"]["after"] == 35.0
    assert out["tpot_fit"]["before"]["b_ms"] == pytest.approx((536 - 84) / 15)


def test_sweep_cli_table_json_and_plot(fake_server: FakeServer, tmp_path: Path) -> None:
    out, png = tmp_path / "s.jsonl", tmp_path / "s.png"
    args = ["bench", "sweep", "--url", fake_server.url, "--concurrency", "1,2",
            "--num-prompts", "2", "--input-len", "8", "--output-len", "4"]  # fmt: skip
    result = CliRunner().invoke(cli, [*args, "--output-file", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "Concurrency sweep" in result.output and "TPOT = " in result.output
    assert len(load(out)) == 2 and png.read_bytes()[:4] == b"\x89PNG"
    result = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert [r["max_concurrency"] for r in summary["levels"]] == [1, 2]
    assert "tpot_fit" in summary


def test_compare_rejects_non_result_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    result = CliRunner().invoke(cli, ["bench", "compare", str(bad), str(bad)])
    assert result.exit_code != 0
    assert "not a bench_serving result line" in str(result.exception or result.output)


# --- the sglang driver, with a stand-in for `python -m sglang.bench_serving` ----------------

FAKE_BENCH_SERVING = """#!{python}
import json, os, sys
with open("{argv_log}.key", "w") as f:
    f.write(os.environ.get("OPENAI_API_KEY", "(none)"))
args = sys.argv[2:]  # after judged_bench_serving.py
opts = dict(zip(args[::2], args[1::2]))
with open("{argv_log}", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if opts.get("--max-concurrency") == "99":
    print("Traceback: boom", file=sys.stderr)
    sys.exit(1)
if opts.get("--max-concurrency") == "98":  # hangs: the level timeout must stop it
    import os, time
    open("{argv_log}.pid", "w").write(str(os.getpid()))
    time.sleep(60)
c = int(opts.get("--max-concurrency", 0))  # bench_serving writes None without one
with open(opts["--output-file"], "a") as f:
    f.write(json.dumps({{"backend": opts["--backend"], "max_concurrency": c or None,
        "request_rate": float(opts.get("--request-rate", "inf")), "completed": 3,
        "duration": 1.0, "output_throughput": 10.0 * c, "mean_tpot_ms": 40.0 + 30.0 * c,
        "server_info": {{"decode": []}}}}) + "\\n")
"""


@pytest.fixture
def fake_sglang_python(tmp_path: Path) -> tuple[Path, Path]:
    script, argv_log = tmp_path / "python", tmp_path / "argv.jsonl"
    script.write_text(FAKE_BENCH_SERVING.format(python=sys.executable, argv_log=argv_log))
    script.chmod(0o755)
    return script, argv_log


def test_sglang_driver_reads_bench_serving_lines(
    fake_server: FakeServer, fake_sglang_python: tuple[Path, Path], tmp_path: Path
) -> None:
    python, argv_log = fake_sglang_python
    out = tmp_path / "sg.jsonl"
    rows = _sweep(
        fake_server, build_levels("1,16", None, 256, 128, 1.0, 1), out,
        driver="sglang", sglang_python=str(python),
    )  # fmt: skip
    assert [r["mean_tpot_ms"] for r in rows] == [70.0, 520.0]
    assert rows[0]["driver"] == "sglang" and rows[0]["num_prompts"] == 8
    fit = tpot_fit(load(out))
    assert fit is not None and fit.b == pytest.approx(30.0)
    argv = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert argv[0][0] == str(JUDGE)  # bench_serving under pdctl's failure rule
    assert rows[0]["failed"] == 8 - 3 and rows[0]["errors"] == []

    def opt(run: int, name: str) -> str:
        return str(argv[run][argv[run].index(name) + 1])

    assert opt(0, "--backend") == "sglang-oai" and opt(0, "--model") == "fake-model"
    assert opt(0, "--num-prompts") == "8" and opt(0, "--random-output-len") == "128"
    assert opt(0, "--extra-request-body") == '{"best_of": null}'  # smg: no best_of + stream
    assert opt(1, "--num-prompts") == "48" and opt(1, "--max-concurrency") == "16"


def test_sglang_driver_failure_shows_its_output(
    fake_server: FakeServer, fake_sglang_python: tuple[Path, Path]
) -> None:
    python, _ = fake_sglang_python
    with pytest.raises(PdctlError, match="exited 1:\nTraceback: boom"):
        _sweep(fake_server, build_levels("99", "1", 8, 8, 1.0, 1),
               driver="sglang", sglang_python=str(python))  # fmt: skip


def test_sglang_driver_level_timeout_stops_the_child(
    fake_server: FakeServer, fake_sglang_python: tuple[Path, Path]
) -> None:
    python, argv_log = fake_sglang_python
    start = time.monotonic()
    with pytest.raises(PdctlError, match="did not finish in 2 s"):
        _sweep(fake_server, build_levels("98", "1", 8, 8, 1.0, 1),
               driver="sglang", sglang_python=str(python), timeout_s=2.0)  # fmt: skip
    assert time.monotonic() - start < 20
    pid = int(Path(f"{argv_log}.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # terminated and reaped, not left behind


def test_default_target_is_the_deployments_gateway_and_decodes(tmp_path: Path) -> None:
    profile = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "sim.yml"
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[pd_hosts]\nhost-a ansible_host=10.0.0.5\n[router]\nhost-a\n"
        f"[all:vars]\npdstack_profile={profile}\n"
    )
    dep = load_deployment(inventory)
    target = sweep_target(None, (), inventory, None, None, "completions")
    assert target.url == dep.client_url
    decodes = [i for i in dep.instances if i.role == Role.DECODE]
    assert target.metrics_urls == tuple(f"{i.url}/metrics" for i in decodes)
    # an explicit URL samples its own /metrics unless told otherwise
    assert sweep_target("http://h:1/", (), inventory, None, "m", "chat").metrics_urls == (
        "http://h:1/metrics",
    )


def test_sweep_refuses_an_output_file_it_could_not_write(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "out.jsonl"
    args = ["bench", "sweep", "--url", "http://127.0.0.1:9", "--output-file", str(missing)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "is not a directory" in result.output


# --- hostile input and a keyed gateway ----------------------------------------------------------
def test_compare_refuses_binary_and_non_numeric_files(
    tmp_path: Path, pdctl: Callable[..., Any]
) -> None:
    good, binary, text = tmp_path / "good.jsonl", tmp_path / "a.png", tmp_path / "t.jsonl"
    write_atomic(good, [_row(1, 10.0, 40.0)])
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff" * 64)
    text.write_text(json.dumps({**_row(1, 10.0, 40.0), "mean_tpot_ms": "fast"}) + "\n")
    for bad, needle in ((binary, "not UTF-8 text"), (text, ":1: mean_tpot_ms is 'fast'")):
        r = pdctl("bench", "compare", str(good), str(bad))
        assert r.exit_code == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"Error: {bad}") and needle in r.stderr
        assert r.stderr.count("\n") == 1


def test_sweep_sends_the_gateway_key_only_to_the_gateway(fake_server: FakeServer) -> None:
    fake_server.state["api_key"] = "sekrit"
    with pytest.raises(PdctlError, match="answered 401: the gateway wants its API key"):
        _sweep(fake_server, build_levels("1", "1", 8, 2, 1.0, 1))
    (row,) = _sweep(fake_server, build_levels("1", "2", 8, 2, 1.0, 1), api_key="sekrit")
    assert row["completed"] == 2 and row["failed"] == 0
    seen = fake_server.state["auth"]
    assert {a for p, a in seen if p.startswith("/v1/")} >= {"Bearer sekrit"}
    assert {a for p, a in seen if p == "/metrics"} == {None}  # engines never see the key


def test_sweep_cli_key_from_the_environment(
    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_server.state["api_key"] = "from-env"
    monkeypatch.setattr("pdctl.ops.gateway.KEY_FILES", (tmp_path / "absent.env",))
    args = ["bench", "sweep", "--url", fake_server.url, "--concurrency", "1",
            "--num-prompts", "1", "--input-len", "8", "--output-len", "2"]  # fmt: skip
    monkeypatch.delenv("PDSTACK_GATEWAY_API_KEY", raising=False)
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code != 0
    assert "--api-key or $PDSTACK_GATEWAY_API_KEY" in str(refused.exception)
    monkeypatch.setenv("PDSTACK_GATEWAY_API_KEY", "from-env")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "from-env" not in result.output


def test_sglang_driver_gets_the_key_in_its_environment_not_argv(
    fake_server: FakeServer, fake_sglang_python: tuple[Path, Path]
) -> None:
    python, argv_log = fake_sglang_python
    fake_server.state["api_key"] = "sekrit"
    _sweep(
        fake_server, build_levels("1", None, 8, 2, 1.0, 1),
        driver="sglang", sglang_python=str(python), api_key="sekrit",
    )  # fmt: skip
    assert Path(f"{argv_log}.key").read_text() == "sekrit"  # bench_serving's OPENAI_API_KEY
    assert "sekrit" not in argv_log.read_text()


# --- open loop: --rate ------------------------------------------------------------------------


def test_open_loop_arrivals_are_poisson_at_the_rate() -> None:
    (level,) = build_levels(None, "2000", 8, 3, 1.0, 4, rate="20")
    assert level.rate == 20.0 and level.concurrency is None and level.label == "20 req/s"
    times = arrival_times(level)
    assert times[0] == 0.0 and times == sorted(times) and times == arrival_times(level)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.06)  # exponential: sd = mean
    assert gaps.std() == pytest.approx(1 / 20, rel=0.1)
    closed = build_levels("4", "3", 8, 3, 1.0, 4)[0]
    assert arrival_times(closed) == [0.0, 0.0, 0.0] and closed.label == "C=4"


def test_open_loop_level_runs_and_fails_requests_by_the_rule(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    fake_server.state.update(fail_every=3, fault="short")  # canary 1, warm-up 2, then every 3rd
    out = tmp_path / "rate.jsonl"
    (row,) = _sweep(fake_server, build_levels(None, "9", 8, 3, 1.0, 1, rate="30"), out)
    assert row["request_rate"] == 30.0 and row["max_concurrency"] is None
    assert row["failed"] == 3 and row["completed"] == 6
    assert row["errors"][0].startswith("short: 2 of 3 tokens")
    (again,) = load(out)  # an open-loop line reads back (and feeds capacity --lengths-from)
    assert again["request_rate"] == 30.0


@pytest.mark.parametrize(
    ("concurrency", "rate", "message"),
    [
        ("4", "2", "give --concurrency or --rate, not both"),
        (None, "0", "--rate '0': give comma-separated request rates above 0"),
        (None, "fast", "--rate 'fast': give comma-separated request rates above 0"),
        (None, "inf", "--rate 'inf': give comma-separated"),
    ],
)
def test_bad_rates_are_one_line(concurrency: str | None, rate: str, message: str) -> None:
    with pytest.raises(PdctlError, match=message):
        build_levels(concurrency, None, 8, 3, 1.0, 1, rate=rate)


def test_rate_levels_default_to_30_seconds_of_arrivals() -> None:
    slow, fast = build_levels(None, None, 8, 3, 1.0, 1, rate="0.1,4")
    assert (slow.num_prompts, fast.num_prompts) == (8, 120)


def test_sweep_cli_at_a_rate(fake_server: FakeServer) -> None:
    args = ["bench", "sweep", "--url", fake_server.url, "--rate", "25", "--num-prompts", "3",
            "--input-len", "8", "--output-len", "4"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "canary, then 25 req/s" in result.output and "Concurrency sweep" in result.output
    result = CliRunner().invoke(cli, [*args, "--format", "json"])
    (row,) = json.loads(result.output[result.output.index("{") :])["levels"]
    assert row["request_rate"] == 25.0 and row["completed"] == 3
    result = CliRunner().invoke(cli, [*args, "--concurrency", "2"])
    assert isinstance(result.exception, PdctlError)
    assert str(result.exception) == "give --concurrency or --rate, not both"


def test_sglang_driver_passes_the_rate(
    fake_server: FakeServer, fake_sglang_python: tuple[Path, Path]
) -> None:
    python, argv_log = fake_sglang_python
    levels = build_levels(None, "8", 256, 128, 1.0, 1, rate="2.5")
    (row,) = _sweep(fake_server, levels, driver="sglang", sglang_python=str(python))
    assert row["request_rate"] == 2.5 and row["max_concurrency"] is None
    (argv,) = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert argv[argv.index("--request-rate") + 1] == "2.5" and "--max-concurrency" not in argv
