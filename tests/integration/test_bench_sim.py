"""pdctl bench sweep through the real gateway (smg) against pdctl.sim engines.

The sim's decode step is a + b·padded_batch ms (PDSIM_STEP_A_MS / PDSIM_STEP_B_MS); the
levels sit on captured graph sizes (1, 4, 8, 16) so the padded batch is the concurrency,
and the fitted TPOT = a + b·C must come back close to the configured law. Simulated time
runs at wall-clock speed (TIME_SCALE 1): faster scales shrink the steps toward the
scheduling jitter of a loaded 2-core CI machine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdctl.analyze.report import analyze_stream
from pdctl.bench.level import Target, build_levels
from pdctl.bench.results import load, tpot_fit
from pdctl.bench.sweep import SweepOptions, run_sweep
from pdctl.cli import cli
from pdctl.testing.stack import Gateway, SimProc

pytestmark = pytest.mark.gateway

A_MS, B_MS, TIME_SCALE = 20.0, 4.0, 1.0
OUTPUT_LEN = 128
LAW_ENV = {
    "PDSIM_STEP_A_MS": str(A_MS),
    "PDSIM_STEP_B_MS": str(B_MS),
    "PDSIM_TIME_SCALE": str(TIME_SCALE),
}


@pytest.fixture
def law_stack(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway]
) -> tuple[SimProc, Gateway]:
    extra = ("--decode-log-interval", "5")
    prefill = sim_factory("prefill", env=LAW_ENV, extra=extra)
    decode = sim_factory("decode", env=LAW_ENV, extra=extra)
    prefill.wait_healthy()
    decode.wait_healthy()
    gateway = gateway_factory([prefill], [decode], "--disable-retries").wait_ready()
    return decode, gateway


def test_sweep_recovers_the_sims_step_law(
    law_stack: tuple[SimProc, Gateway], tmp_path: Path
) -> None:
    decode, gateway = law_stack
    out = tmp_path / "sweep.jsonl"
    # A level's requests start and end in waves (same lengths, closed loop); a log line whose
    # interval spans the gap between two waves (the next wave's prefill and KV transfer: longer
    # on a loaded machine) or a wave's ramp reads slower. Long outputs make the waves long and
    # those lines few: 32 tokens gave a mean step at C=16 of 97.5 ms against 84 once, at a
    # load of about 10.
    levels = build_levels("1,4,8,16", "3,8,16,32", 64, OUTPUT_LEN, 1.0, seed=1)
    target = Target(gateway.url, "", "completions", (decode.url + "/metrics",))
    opts = SweepOptions(timeout_s=120, sample_interval_s=0.2)
    rows = asyncio.run(run_sweep(target, levels, opts, output_file=out))

    assert [r["max_concurrency"] for r in load(out)] == [1, 4, 8, 16]
    for r in rows:
        assert r["completed"] == r["num_prompts"] and r["failed"] == 0
        assert r["total_output_tokens"] == OUTPUT_LEN * r["completed"]
        assert r["server"]["num_running_reqs"]["max"] <= r["max_concurrency"]
        assert r["server"]["is_cuda_graph"]["mean"] == 1.0
    assert max(r["server"]["num_running_reqs"]["max"] for r in rows) >= 12

    fit = tpot_fit(rows)
    assert fit is not None
    assert fit.b / TIME_SCALE == pytest.approx(B_MS, rel=0.15)
    assert fit.a / TIME_SCALE == pytest.approx(A_MS, rel=0.25)
    assert fit.asymptote_tps is not None

    # The decode engine's own log tells the same story to `pdctl analyze journal`. Its gen
    # throughput is over the wall time between log lines (idle gaps included, as in SGLang),
    # so only the steady C=16 level gives a clean step time; the sim logs simulated time.
    with decode.log_path.open("rb") as log:
        report = analyze_stream(log)
    assert report.counts.unparseable == 0 and report.overflow is None
    steady = report.table.rows[16]
    assert steady.eager_lines == 0 and steady.lines >= 5
    assert steady.graph_step_ms == pytest.approx(A_MS + 16 * B_MS, rel=0.15)


def test_sweep_cli_through_gateway(law_stack: tuple[SimProc, Gateway], tmp_path: Path) -> None:
    decode, gateway = law_stack
    png = tmp_path / "sweep.png"
    result = CliRunner().invoke(
        cli,
        ["bench", "sweep", "--url", gateway.url, "--metrics-url", decode.url + "/metrics",
         "--concurrency", "1,4", "--num-prompts", "2,4", "--input-len", "32",
         "--output-len", "8", "--endpoint", "chat", "--plot", str(png), "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert [r["completed"] for r in summary["levels"]] == [2, 4]
    assert summary["levels"][0]["backend"] == "sglang-oai-chat"
    assert png.stat().st_size > 0
