"""pdctl analyze journal: parsing, the decode table, the step-time law, buckets and the CLI."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdctl.analyze.logparse import (
    ANY_TIME,
    DecodeBatch,
    PrefillBatch,
    ScanCounts,
    TimeWindow,
    parse_line,
    scan,
)
from pdctl.analyze.report import JournalReport, analyze_stream
from pdctl.analyze.sources import journalctl_command
from pdctl.analyze.synth import SynthJournal, journal_lines
from pdctl.cli import cli

# Lines as sglang 0.5.23's metrics_reporter writes them, plus older and journald forms.
CURRENT_DECODE = (
    "[2026-11-29 10:00:00 DP0 TP0] Decode batch [1234], #running-req: 57, #token: 9000, "
    "token usage: 0.05, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, "
    "#retracted-req: 0, cuda graph: True, gen throughput (token/s): 731.22, #queue-req: 0"
)
SWA_SPEC_DECODE = (
    "[2026-11-29 10:00:01 TP0] Decode batch, #running-req: 9, #full token: 10, "
    "full token usage: 0.01, #swa token: 5, swa token usage: 0.00, accept len: 2.10, "
    "accept rate: 0.55, npu graph: False, gen throughput (token/s): 99.50, #queue-req: 3, "
    "est. decode TFLOPS/s (per GPU): 1.00"
)
OLD_DECODE = (
    "[2025-01-01 00:00:00] Decode batch. #running-req: 1, #token: 45, token usage: 0.00, "
    "gen throughput (token/s): 6.54, #queue-req: 0"
)
SHORT_PREFIX = "Nov 29 10:00:00 gpu1 python3[4242]: "
CURRENT_PREFILL = (
    "[2026-11-29 10:00:02 TP0] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 64, "
    "token usage: 0.01, #running-req: 3, #queue-req: 1, #pending-token: 0, #bootstrap-req: 0, "
    "#inflight-req: 0, #optimistic-req: 0, cuda graph: False, input throughput (token/s): 2048.50"
)
OLD_PREFILL = (
    "[2025-01-01 00:00:00] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 0"
)


def test_parse_current_old_and_journal_forms() -> None:
    assert parse_line(CURRENT_DECODE) == DecodeBatch(57, 731.22, True, "2026-11-29 10:00:00")
    assert parse_line(SWA_SPEC_DECODE) == DecodeBatch(9, 99.5, False, "2026-11-29 10:00:01")
    assert parse_line(OLD_DECODE) == DecodeBatch(1, 6.54, None, "2025-01-01 00:00:00")
    assert parse_line(SHORT_PREFIX + CURRENT_DECODE) == parse_line(CURRENT_DECODE)
    assert parse_line(CURRENT_PREFILL) == PrefillBatch(
        2, 512, 64, 3, 1, 2048.5, "2026-11-29 10:00:02"
    )
    assert parse_line(OLD_PREFILL) == PrefillBatch(1, 7, 0, 0, 0, None, "2025-01-01 00:00:00")
    assert parse_line("[2026-11-29 10:00:00] Load weight end.") is None


@pytest.mark.parametrize(
    "cut",
    [len("[2026-11-29 10:00:00 TP0] Decode batch [1234], #runn"), -20, -len(", #queue-req: 0")],
)
def test_truncated_decode_line_is_unparseable(cut: int) -> None:
    assert parse_line(CURRENT_DECODE[:cut]) is None


def _scan(
    text: str | bytes, window: TimeWindow = ANY_TIME, chunk: int = 1 << 20
) -> tuple[list[DecodeBatch | PrefillBatch], ScanCounts]:
    counts = ScanCounts()
    data = text.encode() if isinstance(text, str) else text
    return list(scan(io.BytesIO(data), counts, window, chunk)), counts


def test_garbage_truncated_and_mixed_input_is_counted_not_fatal() -> None:
    lines = [
        CURRENT_DECODE,
        "\x00\xff binary noise Decode batch, #running-req: x",
        OLD_DECODE,
        SHORT_PREFIX + CURRENT_PREFILL,
        CURRENT_DECODE[:80],
        "Traceback (most recent call last):",
        OLD_PREFILL,
        "Prefill batch, #new-seq: nope",
        SWA_SPEC_DECODE[:-5],  # still whole up to a field boundary: readable
    ]
    text = "\n".join(lines).encode("latin-1") + b"\n\xc3\x28 Decode batch\n"
    text += CURRENT_DECODE[:50].encode()  # the stream ends mid-line
    batches, counts = _scan(text)
    assert [type(b).__name__ for b in batches] == [
        "DecodeBatch",
        "DecodeBatch",
        "DecodeBatch",
        "PrefillBatch",
        "PrefillBatch",
    ]
    assert counts.unparseable == 5
    assert counts.lines == len(lines) + 2


def test_lines_split_across_chunks_are_whole() -> None:
    text = "".join(journal_lines(SynthJournal(seed=3), 500))
    small, _ = _scan(text, chunk=97)
    big, counts = _scan(text)
    assert small == big and len(big) == 500 and counts.unparseable == 0


def test_time_window_on_sglang_timestamps() -> None:
    text = (
        "\n".join(
            [
                CURRENT_DECODE,
                OLD_DECODE,
                SWA_SPEC_DECODE,
                "Decode batch, #running-req: 2, gen throughput (token/s): 3.00, #queue-req: 0",
            ]
        )
        + "\n"
    )
    batches, counts = _scan(text, TimeWindow("2026-11-29 10:00:01", "2026-11-29 11:00:00"))
    assert [b.running for b in batches] == [9]
    assert counts.out_of_range == 2 and counts.untimed == 1


def _report(cfg: SynthJournal, n: int = 40_000, graph_max_bs: int | None = None) -> JournalReport:
    data = "".join(journal_lines(cfg, n)).encode()
    return analyze_stream(io.BytesIO(data), max_graph=graph_max_bs)


def test_recovers_step_law_and_buckets_from_generated_log() -> None:
    cfg = SynthJournal(a_ms=18.0, b_ms=1.05, max_running=96, seed=1)
    report = _report(cfg)
    assert report.law is not None and report.law.basis == "bucket sizes"
    assert report.law.fit.a == pytest.approx(18.0, rel=0.03)
    assert report.law.fit.b == pytest.approx(1.05, rel=0.03)
    assert report.law.fit.asymptote_tps == pytest.approx(1000 / 1.05, rel=0.03)
    assert [d.boundary for d in report.sawtooth] == list(range(8, 96, 8))
    assert report.buckets == list(range(8, 96, 8))  # 96: inferred max, not a stated one
    assert report.max_graph == 96 and report.overflow is None


def test_law_without_buckets_fits_every_batch_size() -> None:
    # One graph per batch size: no padding, no sawtooth, a straight line.
    cfg = SynthJournal(a_ms=40.0, b_ms=30.0, buckets=tuple(range(1, 65)), max_running=64)
    report = _report(cfg, 10_000)
    assert report.sawtooth == []
    assert report.law is not None and report.law.basis == "all batch sizes"
    assert report.law.fit.b == pytest.approx(30.0, rel=0.02)
    assert report.law.fit.asymptote_tps == pytest.approx(1000 / 30, rel=0.02)


def test_planted_sawtooth_at_a_custom_bucket_list() -> None:
    buckets = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    report = _report(SynthJournal(buckets=buckets, max_running=64, seed=5), graph_max_bs=64)
    assert [d.boundary for d in report.sawtooth] == [8, 12, 16, 24, 32, 48]
    assert all(d.drop_pct > 2 for d in report.sawtooth)


def test_eager_batches_above_largest_graph_are_flagged() -> None:
    cfg = SynthJournal(buckets=(1, 2, 4, *range(8, 33, 8)), max_running=40, seed=2)
    report = _report(cfg, 20_000, graph_max_bs=32)
    assert report.overflow is not None
    assert report.overflow.max_graph == 32 and report.overflow.largest_batch == 40
    eager_rows = [r for r in report.table.sorted_rows() if r.eager_lines]
    assert [r.running for r in eager_rows] == list(range(33, 41))
    assert report.overflow.lines == sum(r.eager_lines for r in eager_rows)
    # the recommendation covers every batch seen, so none would run eager
    assert report.recommended[-1] >= 40


def test_recommendation_is_fine_where_traffic_concentrates() -> None:
    weights = {bs: 20.0 for bs in range(49, 57)}
    report = _report(SynthJournal(max_running=96, weights=weights, seed=4))
    rec = report.recommended
    assert set(range(49, 57)) <= set(rec)  # one graph per size in the hot segment
    assert {1, 2, 4, 8, 12, 16, 24, 96} <= set(rec)
    assert not set(range(17, 24)) & set(rec)  # coarse where it is quiet


def test_old_format_without_graph_flag_has_no_eager() -> None:
    report = _report(SynthJournal(style="old", max_running=32, buckets=tuple(range(1, 33))), 2000)
    assert sum(r.eager_lines for r in report.table.sorted_rows()) == 0
    assert report.table.decode_lines == 2000


@pytest.fixture
def journal_gz(tmp_path: Path) -> Path:
    cfg = SynthJournal(max_running=100, style="short", prefill_every=10, seed=7)
    path = tmp_path / "decode.log.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(journal_lines(cfg, 5000))
        f.write("garbage Decode batch, #running-req\n")
    return path


def test_cli_json_from_gz(journal_gz: Path, tmp_path: Path) -> None:
    png = tmp_path / "decode.png"
    result = CliRunner().invoke(
        cli, ["analyze", "journal", "--file", str(journal_gz), "--format=json", f"--plot={png}"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["input"]["decode_lines"] == 5000
    assert out["input"]["prefill_lines"] == 500
    assert out["input"]["unparseable"] == 1
    assert out["eager_overflow"]["largest_batch"] == 100
    assert out["step_time_fit"]["basis"] == "bucket sizes"
    assert out["recommended_cuda_graph_bs_decode"][-1] == 104
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table_from_stdin(journal_gz: Path) -> None:
    text = gzip.decompress(journal_gz.read_bytes())
    result = CliRunner().invoke(cli, ["analyze", "journal", "--file", "-"], input=text)
    assert result.exit_code == 0, result.output
    assert "Decode throughput by running requests" in result.output
    assert "Graph-bucket sawtooth" in result.output
    assert "Eager overflow" in result.output
    assert "Recommended: --cuda-graph-bs-decode" in result.output
    assert "Prefill: 128,000 new tokens, 0 cached (0.0% hit)" in result.output


def test_cli_refuses_a_plot_it_could_not_write(journal_gz: Path, tmp_path: Path) -> None:
    bad = tmp_path / "missing" / "x.png"
    result = CliRunner().invoke(
        cli, ["analyze", "journal", "--file", str(journal_gz), f"--plot={bad}"]
    )
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_cli_needs_one_source() -> None:
    result = CliRunner().invoke(cli, ["analyze", "journal"])
    assert result.exit_code == 2 and "exactly one of" in result.output


def test_journalctl_command_local_and_ssh() -> None:
    assert journalctl_command("d.service", None, "-1h", None) == [
        "journalctl",
        "-u",
        "d.service",
        "-o",
        "cat",
        "--no-pager",
        "--since",
        "-1h",
    ]
    remote = journalctl_command("d.service", "gpu1", "2026-11-29 10:00", None)
    assert remote[:4] == ["ssh", "-o", "BatchMode=yes", "gpu1"]
    assert remote[4] == "journalctl -u d.service -o cat --no-pager --since '2026-11-29 10:00'"


@pytest.fixture
def fake_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`journalctl` and `ssh` stand-ins on PATH that record their argv and print a journal."""
    log = tmp_path / "journal.log"
    log.write_text("".join(journal_lines(SynthJournal(max_running=40, seed=9), 3000)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("journalctl", "ssh"):
        script = bin_dir / name
        script.write_text(
            f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/argv\n'
            f'case "$*" in *missing*) echo "No such unit" >&2; exit 1;; esac\ncat {log}\n'
        )
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def test_cli_reads_journalctl_locally_and_over_ssh(fake_journalctl: Path) -> None:
    for extra in ([], ["-H", "gpu1"]):
        result = CliRunner().invoke(
            cli,
            ["analyze", "journal", "-u", "pdstack-pd0-decode.service", "--since", "-1h",
             "--format", "json", *extra],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["input"]["decode_lines"] == 3000
    argv = (fake_journalctl / "argv").read_text().splitlines()
    assert argv[0] == "journalctl -u pdstack-pd0-decode.service -o cat --no-pager --since -1h"
    assert argv[1].startswith("ssh -o BatchMode=yes gpu1 journalctl -u pdstack-pd0-decode")


def test_cli_journalctl_failure_is_reported(fake_journalctl: Path) -> None:
    result = CliRunner().invoke(cli, ["analyze", "journal", "-u", "missing.service"])
    assert result.exit_code != 0
    assert "exited 1: No such unit" in str(result.exception)
