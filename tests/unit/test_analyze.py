"""pdctl analyze journal: parsing, the decode table, the step-time law, buckets and the CLI."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdctl.analyze.decode_table import DecodeTable
from pdctl.analyze.logparse import (
    ANY_TIME,
    DecodeBatch,
    DecodeTally,
    PrefillBatch,
    ScanCounts,
    TimeWindow,
    parse_line,
    scan,
    scan_tallies,
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
    assert parse_line(SWA_SPEC_DECODE) == DecodeBatch(9, 99.5, False, "2026-11-29 10:00:01", 2.1)
    assert parse_line(OLD_DECODE) == DecodeBatch(1, 6.54, None, "2025-01-01 00:00:00")
    assert parse_line(SHORT_PREFIX + CURRENT_DECODE) == parse_line(CURRENT_DECODE)
    assert parse_line(CURRENT_PREFILL) == PrefillBatch(
        2, 512, 64, 3, 1, 2048.5, "2026-11-29 10:00:02"
    )
    assert parse_line(OLD_PREFILL) == PrefillBatch(1, 7, 0, 0, 0, None, "2025-01-01 00:00:00")
    assert parse_line("[2026-11-29 10:00:00] Load weight end.") is None


# Every rank sglang 0.5.23's configure_scheduler_process can put in the prefix, a PD decode
# with host receive, and speculative decoding (`block accept len` must not be read as it).
FULL_PREFIX_SPEC_DECODE = (
    "[2026-11-29 10:00:03.123 DP3 PP1 ATTN_CP1 MOE_DP1 TP12 EP12] Decode batch, "
    "#running-req: 40, #token: 9000, token usage: 0.05, accept len: 3.20, accept rate: 0.73, "
    "block accept len: 1.50, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 1, "
    "#host-receive-req: 2, #retracted-req: 0, cuda graph: True, "
    "gen throughput (token/s): 1280.00, #queue-req: 0"
)


def test_any_rank_prefix_host_receive_and_accept_len() -> None:
    batch = parse_line(FULL_PREFIX_SPEC_DECODE)
    assert batch == DecodeBatch(40, 1280.0, True, "2026-11-29 10:00:03", 3.2)
    assert isinstance(batch, DecodeBatch) and batch.tokens_per_step == pytest.approx(128.0)
    plain = FULL_PREFIX_SPEC_DECODE.replace("accept len: 3.20, accept rate: 0.73, ", "")
    assert parse_line(plain) == DecodeBatch(40, 1280.0, True, "2026-11-29 10:00:03", None)


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
        CURRENT_DECODE.replace("731.22", "7.3.1"),  # not a number: unparseable, no crash
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
    assert counts.unparseable == 6
    assert counts.lines == len(lines) + 2


def test_lines_split_across_chunks_are_whole() -> None:
    text = "".join(journal_lines(SynthJournal(seed=3), 500))
    small, _ = _scan(text, chunk=97)
    big, counts = _scan(text)
    assert small == big and len(big) == 500 and counts.unparseable == 0


def _tallied(data: bytes, chunk: int) -> tuple[DecodeTable, ScanCounts]:
    counts, table = ScanCounts(), DecodeTable()
    for item in scan_tallies(io.BytesIO(data), counts, chunk):
        if isinstance(item, DecodeTally):
            table.merge(item)
        else:
            table.add(item)
    return table, counts


def _rows(table: DecodeTable) -> list[tuple[float | int | None, ...]]:
    return [
        (r.running, r.lines, r.eager_lines, r.accept_lines, r.tps_sum, r.graph_step_ms_sum,
         r.eager_step_ms_sum, r.accept_sum)
        for r in table.sorted_rows()
    ]  # fmt: skip


@pytest.mark.parametrize("chunk", [61, 4096, 1 << 20])
def test_summed_fast_path_equals_line_by_line(chunk: int) -> None:
    """The no-window path sums lines without building them; it must agree with the
    line-by-line path on every sum, whatever the chunking, on mixed and garbled input."""
    spec = SynthJournal(accept_len=2.4, max_running=40, prefill_every=7, seed=11)
    lines = [
        *journal_lines(spec, 300),
        *journal_lines(SynthJournal(style="old", max_running=20, seed=12), 50),
        *journal_lines(SynthJournal(ranks="DP1 PP1 ATTN_CP1 MOE_DP1 TP1 EP1", seed=13), 50),
        CURRENT_DECODE[:90] + "\n",
        CURRENT_DECODE.replace("731.22", "0.00") + "\n",  # idle: no throughput
        CURRENT_DECODE.replace("#running-req: 57", "#running-req: 0") + "\n",
        "garbage Decode batch, #running-req\n",
        CURRENT_DECODE.replace("731.22", "7.3.1") + "\n",
        "Prefill batch, #new-seq: nope\n",
    ]
    data = "".join(lines).encode()
    fast, fast_counts = _tallied(data, chunk)
    slow = DecodeTable()
    batches, slow_counts = _scan(data, chunk=chunk)
    for b in batches:
        slow.add(b)
    assert fast_counts == slow_counts
    assert fast_counts.unparseable == 4 and fast.idle_lines == slow.idle_lines == 2
    assert [r[:4] for r in _rows(fast)] == [r[:4] for r in _rows(slow)]
    for f, s in zip(_rows(fast), _rows(slow), strict=True):
        assert f[4:] == pytest.approx(s[4:], rel=1e-9)
    assert fast.prefill == slow.prefill and fast.prefill.lines == 300 // 7
    assert fast.accept_len == pytest.approx(slow.accept_len) and fast.accept_len is not None


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


def test_recovers_planted_step_law_under_speculative_decoding() -> None:
    """Held-back check: lines carry `accept len` (drawn around 2.5 per line) and tok/s =
    running x accept len / step. The law must come out per step, not per token."""
    cfg = SynthJournal(a_ms=18.0, b_ms=1.05, max_running=96, accept_len=2.5, seed=21)
    report = _report(cfg)
    assert report.table.accept_len == pytest.approx(2.5, abs=0.01)
    law = report.law
    assert law is not None and law.basis == "bucket sizes" and law.accept_len is not None
    assert law.fit.a == pytest.approx(18.0, rel=0.03)
    assert law.fit.b == pytest.approx(1.05, rel=0.03)
    # steps/s per request at the limit x tokens per step
    assert law.asymptote_tps == pytest.approx(2.5 * 1000 / 1.05, rel=0.03)
    assert [d.boundary for d in report.sawtooth] == list(range(8, 96, 8))
    fit = report.as_dict()["step_time_fit"]
    assert fit["per"] == "speculative step" and fit["accept_len"] == law.accept_len
    row = report.as_dict()["decode"][0]
    assert row["accept_len"] == pytest.approx(2.5, abs=0.1)


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


def test_cli_says_when_steps_are_speculative(tmp_path: Path) -> None:
    path = tmp_path / "spec.log"
    cfg = SynthJournal(accept_len=3.0, max_running=32, buckets=tuple(range(1, 33)), seed=8)
    path.write_text("".join(journal_lines(cfg, 3000)))
    result = CliRunner().invoke(cli, ["analyze", "journal", "--file", str(path)])
    assert result.exit_code == 0, result.output
    header = next(ln for ln in result.output.splitlines() if "running" in ln and "lines" in ln)
    assert "accept" in header  # the column, next to step ms
    text = " ".join(result.output.split())  # rich wraps at the terminal width
    assert "Decode throughput by running requests (speculative decoding)" in text
    assert "Speculative decoding: mean accept len 3.0" in text
    assert "step ms = 1000 x running x accept len / tok/s" in text
    assert "per speculative step" in text and "at accept len 3.0" in text
    as_json = CliRunner().invoke(cli, ["analyze", "journal", "--file", str(path), "--format=json"])
    out = json.loads(as_json.output)
    assert out["accept_len"] == pytest.approx(3.0, abs=0.02)
    assert out["step_time_fit"]["b_ms"] == pytest.approx(1.05, rel=0.03)


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
