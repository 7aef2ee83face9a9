"""Decode batches from an engine's journal: graph vs eager, running requests and step time.
SGLang logs one `Decode batch` line every --decode-log-interval steps; the metrics give only
the last batch's graph flag, the journal gives every logged batch. Lines are parsed by
pdctl.analyze (the same parser as `pdctl analyze journal`): any rank prefix (DP, PP, ATTN_CP,
MOE_DP, TP, EP), PD fields such as #host-receive-req, and speculative decoding's `accept len`,
which makes a step's time running x accept len / gen throughput."""

from __future__ import annotations

import bisect
import shutil
import subprocess
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pdctl.analyze.logparse import DecodeBatch, parse_line
from pdctl.exporter.statelog import StateLog

RUNNING_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 128, 160, 192, 256)
CURSOR_PREFIX = "-- cursor: "
STEP_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass
class DecodeStats:
    batches: dict[str, int] = field(default_factory=dict)  # graph | eager | unknown
    running: Histogram = field(default_factory=lambda: Histogram(RUNNING_BUCKETS))
    step_s: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))

    def add(self, batch: DecodeBatch) -> None:
        mode = {True: "graph", False: "eager", None: "unknown"}[batch.cuda_graph]
        self.batches[mode] = self.batches.get(mode, 0) + 1
        self.running.observe(batch.running)
        if batch.gen_throughput > 0 and batch.running > 0:
            # One step makes `accept len` tokens per running request (1 without speculation).
            self.step_s.observe(batch.tokens_per_step / batch.gen_throughput)


def read_journal(unit: str, cursor: str | None, first: bool) -> tuple[list[str], str | None]:
    """The unit's lines after `cursor` (none on the first read: from now on) and the new cursor."""
    if shutil.which("journalctl") is None:
        raise OSError("journalctl not found (not a systemd host?)")
    argv = ["journalctl", "-u", unit, "-o", "cat", "--show-cursor", "-q", "--no-pager"]
    if cursor is not None:
        argv += ["--after-cursor", cursor]
    elif first:
        argv += ["-n", "0"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=60)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"journalctl -u {unit} timed out") from e
    if out.returncode != 0:
        raise OSError(f"journalctl -u {unit}: {out.stderr.strip() or f'exit {out.returncode}'}")
    lines = out.stdout.splitlines()
    if lines and lines[-1].startswith(CURSOR_PREFIX):
        cursor = lines.pop()[len(CURSOR_PREFIX) :]
    return lines, cursor


def file_lines(path: Path, stop: threading.Event, poll_s: float = 0.2) -> Iterator[str]:
    """A log file from its start, then followed as it grows (replays and tests)."""
    with path.open(errors="replace") as f:
        while not stop.is_set():
            line = f.readline()
            if line:
                yield line
            else:
                stop.wait(poll_s)


@dataclass(frozen=True)
class JournalTarget:
    engine: str  # HOST/PAIR-ROLE
    pair: str  # HOST/PAIR
    unit: str
    file: Path | None = None  # read this file instead of the unit's journal


class DecodeJournal:
    """Follows one decode engine's log in a thread; restarts the reader after a failure."""

    def __init__(
        self, target: JournalTarget, log: StateLog, poll_s: float = 5.0, retry_s: float = 10.0
    ) -> None:
        self.target = target
        self.log = log
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.error: str | None = None
        self._stats = DecodeStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"journal {target.engine}", daemon=True
        )

    def start(self) -> DecodeJournal:
        self._thread.start()
        return self

    def _consume(self, lines: Iterable[str]) -> None:
        for line in lines:
            batch = parse_line(line)
            if isinstance(batch, DecodeBatch):
                with self._lock:
                    self._stats.add(batch)

    def _run(self) -> None:
        """Polls the journal with a cursor (not `journalctl -f`: under the unit's
        ProtectKernelTunables/ProtectControlGroups it followed nothing on the test host);
        after a failure the cursor is kept, so no line is lost or counted twice."""
        cursor, first = None, True
        while not self._stop.is_set():
            try:
                if self.target.file is not None:
                    self._consume(file_lines(self.target.file, self._stop))
                else:
                    lines, cursor = read_journal(self.target.unit, cursor, first)
                    first = False
                    self._consume(lines)
                self.error = None
            except OSError as e:
                self.error = str(e)
            if self._stop.is_set():
                return
            self.log.report(f"journal {self.target.engine}", self.error)
            self._stop.wait(self.retry_s if self.error else self.poll_s)

    def stats(self) -> DecodeStats:
        with self._lock:
            copy = DecodeStats(dict(self._stats.batches))
            for mine, theirs in (
                (copy.running, self._stats.running),
                (copy.step_s, self._stats.step_s),
            ):
                mine.counts, mine.total = list(theirs.counts), theirs.total
            return copy

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=6)
