"""pdctl.sim scheduler log lines match sglang 0.5.23's format byte for byte."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import subprocess
import sys

import aiohttp
import pytest

from pdctl.analyze.logparse import DecodeBatch, parse_line
from pdctl.analyze.report import analyze_stream
from pdctl.sim.args import resolve
from pdctl.sim.logs import (
    DecodeStats,
    PrefillStats,
    configure,
    decode_line,
    prefill_line,
    rank_prefix,
)
from pdctl.testing.stack import free_port, in_process


def test_decode_line_on_a_decode_server() -> None:
    line = decode_line(
        DecodeStats(
            running_req=57,
            num_token=20000,
            token_usage=0.0312,
            cuda_graph=True,
            gen_throughput=671.234,
            queue_req=0,
            preallocated_usage=0.0,
            prealloc_req=0,
            transfer_req=2,
            retracted_req=0,
        )
    )
    assert line == (
        "Decode batch, #running-req: 57, #token: 20000, token usage: 0.03, "
        "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 2, #retracted-req: 0, "
        "cuda graph: True, gen throughput (token/s): 671.23, #queue-req: 0"
    )


def test_decode_line_unified() -> None:
    line = decode_line(DecodeStats(3, 120, 0.5, False, 10.0, 4))
    assert line == (
        "Decode batch, #running-req: 3, #token: 120, token usage: 0.50, "
        "cuda graph: False, gen throughput (token/s): 10.00, #queue-req: 4"
    )


def test_prefill_line_on_a_prefill_server() -> None:
    line = prefill_line(
        PrefillStats(
            new_seq=2,
            new_token=512,
            cached_token=0,
            token_usage=0.01,
            running_req=0,
            queue_req=1,
            pending_token=256,
            cuda_graph=False,
            input_throughput=12345.678,
            bootstrap_req=3,
            inflight_req=2,
            optimistic_req=0,
        )
    )
    assert line == (
        "Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, token usage: 0.01, "
        "#running-req: 0, #queue-req: 1, #pending-token: 256, #bootstrap-req: 3, "
        "#inflight-req: 2, #optimistic-req: 0, cuda graph: False, "
        "input throughput (token/s): 12345.68"
    )


def test_prefix_shows_only_dimensions_above_one() -> None:
    assert rank_prefix(tp_size=1, dp_size=1, pp_size=1) == ""
    assert rank_prefix(tp_size=4, dp_size=1, pp_size=1) == " TP0"
    assert rank_prefix(tp_size=4, dp_size=2, pp_size=2) == " DP0 PP0 TP0"
    assert rank_prefix(tp_size=8, ep_size=8) == " TP0 EP0"
    # configure_scheduler_process's order
    assert (
        rank_prefix(tp_size=4, dp_size=2, pp_size=2, ep_size=4, attn_cp_size=2, moe_dp_size=2)
        == " DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0"
    )


def test_decode_line_speculative_with_host_receive() -> None:
    line = decode_line(
        DecodeStats(
            running_req=8,
            num_token=900,
            token_usage=0.01,
            cuda_graph=True,
            gen_throughput=400.0,
            queue_req=0,
            preallocated_usage=0.0,
            prealloc_req=0,
            transfer_req=0,
            retracted_req=0,
            host_receive_req=0,
            accept_len=2.5,
            accept_rate=0.5,
        )
    )
    # metrics_reporter: accept fields right after the usage part, #host-receive-req before
    # #retracted-req
    assert line == (
        "Decode batch, #running-req: 8, #token: 900, token usage: 0.01, accept len: 2.50, "
        "accept rate: 0.50, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, "
        "#host-receive-req: 0, #retracted-req: 0, cuda graph: True, "
        "gen throughput (token/s): 400.00, #queue-req: 0"
    )
    assert parse_line("[2026-11-29 10:00:00 DP0 TP0 EP0] " + line) == DecodeBatch(
        8, 400.0, True, "2026-11-29 10:00:00", 2.5
    )


def test_launch_line_sets_the_prefix() -> None:
    """`python -m pdctl.sim` builds its prefix from SGLang's flags (aliases included)."""
    argv = [sys.executable, "-m", "pdctl.sim", "--model-path", "/m", "--port", str(free_port())]
    argv += ["--disaggregation-bootstrap-port", str(free_port()), "--tp", "4", "--dp-size", "2"]
    argv += ["--expert-parallel-size", "4", "--attention-context-parallel-size", "2"]
    argv += ["--moe-data-parallel-size", "2", "--pp-size", "2", "--not-modelled"]
    env = {**os.environ, "PDSIM_STARTUP_DELAY_S": "0"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert " DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0] pdctl.sim ignores arguments" in first


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ([], "PDSIM_SPEC_ACCEPT_LEN needs --speculative-algorithm"),
        (["--speculative-algorithm", "EAGLE"], "PDSIM_SPEC_ACCEPT_LEN=5 must be within [1, 4]"),
    ],
)
def test_bad_accept_length_is_refused(flags: list[str], error: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(error)):
        resolve(["--model-path", "/m", *flags], {"PDSIM_SPEC_ACCEPT_LEN": "5"})


def test_speculative_defaults_follow_sglangs_auto_choice() -> None:
    cfg = resolve(["--model-path", "/m", "--speculative-algorithm", "EAGLE"], {})
    assert (cfg.spec_draft_tokens, cfg.spec_accept_len) == (4, 2.5)
    cfg = resolve(["--model-path", "/m", "--speculative-algorithm", "NEXTN",
                   "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "2"],
                  {"PDSIM_SPEC_ACCEPT_LEN": "1.8"})  # fmt: skip
    assert (cfg.spec_draft_tokens, cfg.spec_accept_len) == (2, 1.8)
    assert resolve(["--model-path", "/m"], {}).spec_draft_tokens is None


def test_speculative_engine_logs_accept_len_and_scales_tokens_per_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One request of 401 tokens, decode lines every 5 steps: each step gains ~2.5 tokens, the
    lines say so (accept rate = (accept len - 1) / 3 drafts), the answer has every token."""
    env = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0", "PDSIM_SPEC_ACCEPT_LEN": "2.5"}
    flags = ["--speculative-algorithm", "EAGLE", "--decode-log-interval", "5"]

    async def run() -> dict[str, object]:
        async with (
            in_process("null", env, *flags) as server,
            aiohttp.ClientSession(server.url) as http,
        ):
            body = {"text": "x" * 40, "sampling_params": {"max_new_tokens": 401}}
            async with http.post("/generate", json=body) as resp:
                assert resp.status == 200
                answer: dict[str, object] = await resp.json()
                return answer

    answer = asyncio.run(run())
    assert answer["meta_info"]["completion_tokens"] == 401  # type: ignore[index]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Decode batch" in ln]
    batches = [b for ln in lines if isinstance(b := parse_line(ln), DecodeBatch)]
    assert len(batches) == len(lines) and batches
    accepts = [b.accept_len for b in batches if b.accept_len is not None]
    assert len(accepts) == len(batches)
    # 400 decode tokens in about 400 / 2.5 = 160 steps: 32 lines at one per 5 steps
    assert 26 <= len(lines) <= 38
    assert sum(accepts) / len(accepts) == pytest.approx(2.5, abs=0.25)
    for ln, accept in zip(lines, accepts, strict=True):
        rate = float(ln.split("accept rate: ")[1].split(",")[0])
        assert rate == pytest.approx((accept - 1) / 3, abs=0.006)


def test_logger_format(capsys: object) -> None:
    log = configure("info", " TP0")
    record = logging.LogRecord("pdctl.sim", logging.INFO, __file__, 1, "hello", None, None)
    record.created = 0.0
    formatted = log.handlers[0].format(record)
    assert formatted.endswith(" TP0] hello")
    assert formatted[0] == "[" and len(formatted.split("]")[0]) == len("[1970-01-01 00:00:00 TP0")


def test_analyze_journal_reads_the_sims_speculative_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """End to end: 16 requests decoding together on a sim with accept len 2.5; `pdctl analyze
    journal` on its log gives the planted step a + b x 16 per step, not per token.

    The engine's first decode line is left out: SGLang times each line's window from the line
    before, and the first one's from the scheduler's start (metrics_reporter _init_metrics
    sets last_decode_stats_tic), so it also counts the wait for the requests to arrive, which
    on a loaded machine is seconds."""
    env = {
        "PDSIM_TIME_SCALE": "0.5",
        "PDSIM_STARTUP_DELAY_S": "0",
        "PDSIM_STEP_A_MS": "50",
        "PDSIM_STEP_B_MS": "5",
        "PDSIM_SPEC_ACCEPT_LEN": "2.5",
    }
    flags = ["--speculative-algorithm", "EAGLE", "--decode-log-interval", "5"]

    async def run() -> None:
        async with (
            in_process("null", env, *flags) as server,
            aiohttp.ClientSession(server.url) as http,
        ):

            async def one(i: int) -> None:
                body = {
                    "text": "x" * 40,
                    "rid": f"r{i}",
                    "sampling_params": {"max_new_tokens": 120},
                }
                async with http.post("/generate", json=body) as resp:
                    assert resp.status == 200

            await asyncio.gather(*(one(i) for i in range(16)))

    asyncio.run(run())
    lines = capsys.readouterr().out.splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if "Decode batch" in ln)
    report = analyze_stream(io.BytesIO("".join(lines[:first] + lines[first + 1 :]).encode()))
    steady = report.table.rows[16]
    assert steady.lines >= 5 and steady.eager_lines == 0
    assert steady.mean_accept_len == pytest.approx(2.5, abs=0.3)
    assert steady.graph_step_ms == pytest.approx(50 + 5 * 16, rel=0.15)
