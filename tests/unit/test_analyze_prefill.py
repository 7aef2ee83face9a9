"""pdctl analyze journal on prefill journals: the batch-time law and the start-up flags."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdctl.analyze.logparse import ANY_TIME, EngineFlags, ScanCounts, TimeWindow, scan
from pdctl.analyze.report import analyze_stream
from pdctl.analyze.synth import SynthJournal, SynthPrefill, journal_lines, prefill_journal_lines
from pdctl.cli import cli

SERVER_ARGS = (
    "[2026-11-29 09:59:00] server_args=ServerArgs(model_path='/models/dsv4', tp_size=4, "
    "mem_fraction_static=0.6, json_model_override_args='{\"a\": 1}', "
    "cuda_graph_bs_decode=[1, 2, 4, 8], disaggregation_mode='prefill', context_length=8192, "
    "speculative_algorithm=None, enable_metrics=True, disable_cuda_graph=False)\n"
)
SCHEDULER_LIMITS = (
    "[2026-11-29 09:59:30] max_total_num_tokens=500000, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=64, context_len=4096, "
    "available_gpu_mem=12.00 GB\n"
)
CAPTURE_END = (
    "[2026-11-29 09:59:20] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16], "
    "elapsed=2.00 s, mem usage=2.42 GB, avail mem=20.00 GB.\n"
)


def _analyze(text: str, window: TimeWindow = ANY_TIME) -> dict[str, object]:
    return analyze_stream(io.BytesIO(text.encode()), window).as_dict()


@pytest.mark.parametrize("window", [ANY_TIME, TimeWindow(since="2026-11-29 10:00:00")])
def test_recovers_planted_prefill_law(window: TimeWindow) -> None:
    """Only back-to-back batches time a forward: idle gaps (nothing queued) must not bend it."""
    cfg = SynthPrefill(a_ms=30.0, b_ms=0.05, busy=0.5, idle_ms=400.0, seed=1)
    out = _analyze("".join(prefill_journal_lines(cfg, 3000)), window)
    prefill = out["prefill"]
    assert isinstance(prefill, dict)
    fit = prefill["fit"]
    assert fit["a_ms"] == pytest.approx(30.0, rel=0.03)
    assert fit["b_ms"] == pytest.approx(0.05, rel=0.01)
    assert fit["points"] == len(cfg.new_tokens)
    assert 0.4 * 3000 < prefill["busy_lines"] < 0.6 * 3000


def test_prefill_law_needs_two_batch_sizes() -> None:
    one_size = SynthPrefill(new_tokens=(1024,), busy=1.0)
    prefill = _analyze("".join(prefill_journal_lines(one_size, 50)))["prefill"]
    assert isinstance(prefill, dict)
    assert prefill["fit"] is None and prefill["busy_lines"] == 49


def test_never_queued_prefill_has_no_law() -> None:
    idle = _analyze("".join(prefill_journal_lines(SynthPrefill(busy=0.0), 200)))
    assert idle["prefill"]["fit"] is None  # type: ignore[index]


def test_startup_flags_are_read_and_aliased() -> None:
    out = _analyze(SERVER_ARGS + CAPTURE_END + SCHEDULER_LIMITS)
    assert out["engine_flags"] == {
        "model_path": "/models/dsv4",
        "tp_size": 4,
        "mem_fraction_static": 0.6,
        "cuda_graph_bs_decode": [1, 2, 4, 8, 16],  # what was captured wins over the request
        "disaggregation_mode": "prefill",
        "context_length": 4096,  # the scheduler's effective value, logged after the args
        "speculative_algorithm": None,
        "disable_cuda_graph": False,
        "max_total_num_tokens": 500000,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "max_running_requests": 64,
    }


def test_startup_flags_split_across_chunks_and_outside_the_window() -> None:
    decode = "".join(journal_lines(SynthJournal(seed=2), 50))
    text = (SERVER_ARGS + decode).encode()
    counts = ScanCounts()
    found = [
        b
        for b in scan(io.BytesIO(text), counts, TimeWindow(since="2026-11-29 10:00:00"), 97)
        if isinstance(b, EngineFlags)
    ]
    assert [f.flags["tp_size"] for f in found] == [4]


def test_json_carries_both_laws_buckets_and_flags(tmp_path: Path) -> None:
    journal = tmp_path / "both.log"
    decode = "".join(journal_lines(SynthJournal(seed=4), 20_000))
    prefill = "".join(prefill_journal_lines(SynthPrefill(seed=4), 500))
    journal.write_text(SERVER_ARGS + decode + prefill)
    result = CliRunner().invoke(
        cli, ["analyze", "journal", "--file", str(journal), "--format=json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["step_time_fit"]["a_ms"] == pytest.approx(18.0, rel=0.05)
    assert out["prefill"]["fit"]["b_ms"] == pytest.approx(0.05, rel=0.02)
    # the sawtooth shows every bucket but the top one, which the largest graph batch gives
    assert out["graph_buckets"] == list(range(8, 96, 8)) and out["max_graph_bs"] == 96
    assert out["engine_flags"]["tp_size"] == 4
    table = CliRunner().invoke(cli, ["analyze", "journal", "--file", str(journal)])
    assert "Prefill batch time: 30." in table.output and "tp_size=4" in table.output
