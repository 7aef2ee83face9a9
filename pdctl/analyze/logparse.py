"""Scheduler log lines of SGLang (`Decode batch` / `Prefill batch`) parsed out of a byte stream.

Verified against sglang 0.5.23 `srt/managers/scheduler_components/metrics_reporter.py` and
`srt/managers/scheduler.py` (configure_scheduler_process, the prefix):

    [2026-11-29 10:00:00 DP0 PP0 TP0 EP0] Decode batch [1234], #running-req: 57, #token: 9000,
    token usage: 0.05, accept len: 2.41, accept rate: 0.47, pre-allocated usage: 0.00,
    #prealloc-req: 0, #transfer-req: 0, #host-receive-req: 0, #retracted-req: 0,
    cuda graph: True, gen throughput (token/s): 731.22, #queue-req: 0

- the prefix is `[%Y-%m-%d %H:%M:%S(.mmm with SGLANG_LOG_MS)( DPx)( PPx)( ATTN_CPx)( MOE_DPx)
  ( TPx)( EPx)]`: DP whenever a DP controller set a rank, the others when their size is > 1;
  only the attention-TP rank 0 of each scheduler logs;
- ` [iter]` after `batch` appears only with SGLANG_LOG_FORWARD_ITERS;
- the graph flag is `cuda graph`, or `cpu graph` / `npu graph` / `musa graph` on those devices;
- the usage part varies by KV pool (`#token, token usage` or `#full token, full token usage,
  #swa token, swa token usage`, mamba, hisparse); speculative decoding adds `accept len: x,
  accept rate: y, ` right after it (then `cap len`, `block accept len` in some modes); PD
  decode adds prealloc/transfer counts, `#host-receive-req` when
  --disaggregation-decode-host-receive-threshold < 1; MFU metrics append `est. …` fields.
Older releases wrote `Decode batch. #running-req: …` (a period) and may lack the graph flag.

`Prefill batch` lines are written when a batch is scheduled; their `input throughput` is the
previous batch's new tokens over the time since the previous line (`log_prefill_stats`), so
it pairs with the line before (fit.py reads the prefill law from those pairs).

Start-up lines name the flags a law was measured under: `server_args=ServerArgs(...)`, the
scheduler's `max_total_num_tokens=…, max_running_requests=…, context_len=…` and the decode
graph capture's `CUDA graph end. bs=[…]`. Each marker is found with `bytes.find`, so chunks
without one cost no regex pass.

`accept len` is generated tokens per running request per decode step (accepted drafts plus
the bonus token), so with speculation one step yields `running x accept len` tokens.

The scanner runs one `findall` per kind and chunk instead of a Python loop over lines (lines
that are not batch lines cost no Python at all) and sums decode lines per batch size without
building an object per line: that is what keeps multi-GB journals cheap. Lines carrying a
marker that the pattern cannot read (truncated, garbled, an unknown layout) are counted as
unparseable, never fatal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

DECODE_MARKER = b"Decode batch"
PREFILL_MARKER = b"Prefill batch"
ACCEPT_FIELD = b", accept len: "

# Each pattern is the marker plus an optional body: every marker is one match, and a match
# without its body (group 1 empty) is a line the pattern cannot read. That counts the
# unparseable lines without a second scan of the chunk for the marker.
# `[^\n]*` keeps a match inside one line and skips unknown fields between the named ones; greedy
# (run to the line end, back up to the field) is 2.5x faster here than lazy. The graph flag
# always sits right before `gen throughput`: a fixed-width lookbehind captures the 6 bytes
# there (`True, ` / `alse, `) once per match, where an optional group was tried at every
# position (4-6x slower). A field follows each number, so a line cut inside it is not read as
# a smaller number; `\d+\.?\d*` is always a float() (`1.2.3` is no match, so it cannot raise).
_SEP = rb"(?: \[\d+\])?[.,] "
_NUM = rb"(\d+\.?\d*)"
_DECODE_HEAD = _SEP + rb"#running-req: (\d+),"
_DECODE_TAIL = rb"[^\n]*gen throughput(?<=([^\n]{6})gen throughput) \(token/s\): " + _NUM + b", "
# The empty group stands for `accept len`, so both decode patterns give the same four groups.
DECODE_RE = re.compile(  # running, accept len (empty), flag, tok/s
    DECODE_MARKER + rb"(?:" + _DECODE_HEAD + rb"()" + _DECODE_TAIL + rb")?"
)
# `accept len` is followed by `accept rate` (`block accept len` never is). The optional group
# costs a second pass over each line, so it is used only on chunks that hold the field.
SPEC_DECODE_RE = re.compile(  # running, accept len, flag, tok/s
    DECODE_MARKER
    + rb"(?:"
    + _DECODE_HEAD
    + rb"(?:[^\n]*"
    + ACCEPT_FIELD
    + _NUM
    + rb", accept rate)?"
    + _DECODE_TAIL
    + rb")?"
)
PREFILL_RE = re.compile(
    PREFILL_MARKER
    + rb"(?:"
    + _SEP
    + rb"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+),[^\n]*"
    rb"#running-req: (\d+), #queue-req: (\d+)(?=,|\r?\n|$)"
    rb"(?:[^\n]*input throughput \(token/s\): " + _NUM + rb"(?=,|\r?\n|$))?"
    rb")?"
)
# SGLang's own prefix; journalctl `-o short` puts `Mon dd HH:MM:SS host unit[pid]: ` before it.
TIMESTAMP_RE = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")

CHUNK_BYTES = 4 << 20

STARTUP_MARKERS = (b"server_args=ServerArgs(", b"max_total_num_tokens=", b"CUDA graph end. bs=")
# key=value in a repr: a quoted string, a list, or a bare token up to the next separator.
_ASSIGN_RE = re.compile(rb"(\w+)=('[^']*'|\[[^\]]*\]|[^,()\[\]\s]+)")
# The flags a law depends on (what capacity warns about when the profile differs).
KEPT_FLAGS = frozenset(
    {
        "model_path",
        "tp_size",
        "dp_size",
        "ep_size",
        "pp_size",
        "mem_fraction_static",
        "context_length",
        "max_running_requests",
        "max_total_num_tokens",
        "chunked_prefill_size",
        "max_prefill_tokens",
        "page_size",
        "kv_cache_dtype",
        "disaggregation_mode",
        "speculative_algorithm",
        "disable_cuda_graph",
        "cuda_graph_max_bs",
        "cuda_graph_bs",
        "cuda_graph_max_bs_decode",
        "cuda_graph_bs_decode",
    }
)
# The scheduler line and the capture line spell two of them differently.
_FLAG_ALIASES = {"context_len": "context_length", "bs": "cuda_graph_bs_decode"}

FlagValue = str | int | float | bool | list[int] | None


class DecodeBatch(NamedTuple):  # a tuple: built per line on the windowed path
    running: int
    gen_throughput: float
    cuda_graph: bool | None  # None: the release did not log the flag
    timestamp: str | None = None
    accept_len: float | None = None  # speculative decoding only

    @property
    def tokens_per_step(self) -> float:
        """Running requests x tokens each gains per step (the accept length when speculating)."""
        return self.running * (self.accept_len or 1.0)


class PrefillBatch(NamedTuple):
    new_seq: int
    new_token: int
    cached_token: int
    running: int
    queue: int
    input_throughput: float | None
    timestamp: str | None = None


class EngineFlags(NamedTuple):
    """The flags one start-up line states."""

    flags: dict[str, FlagValue]


def flag_value(raw: bytes) -> FlagValue:
    text = raw.decode(errors="replace")
    if text.startswith("'"):
        return text.strip("'")
    if text.startswith("["):
        items = [i.strip() for i in text.strip("[]").split(",") if i.strip()]
        return [int(i) for i in items] if all(i.isdigit() for i in items) else text
    known: dict[str, FlagValue] = {"None": None, "True": True, "False": False}
    if text in known:
        return known[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_flags(line: bytes) -> EngineFlags:
    found: dict[str, FlagValue] = {}
    for key, raw in _ASSIGN_RE.findall(line):
        name = key.decode()
        name = _FLAG_ALIASES.get(name, name)
        if name in KEPT_FLAGS:
            found[name] = flag_value(raw)
    return EngineFlags(found)


def startup_flags(buf: bytes | bytearray, end: int) -> Iterator[EngineFlags]:
    """The start-up lines of buf[:end] holding flags, in the order of the markers."""
    for marker in STARTUP_MARKERS:
        pos = buf.find(marker, 0, end)
        while pos >= 0:
            start = buf.rfind(b"\n", 0, pos) + 1
            stop = buf.find(b"\n", pos, end)
            stop = end if stop < 0 else stop
            if flags := parse_flags(bytes(buf[start:stop])).flags:
                yield EngineFlags(flags)
            pos = buf.find(marker, stop, end)


@dataclass
class ScanCounts:
    """What the stream held besides the batches it yielded."""

    lines: int = 0
    bytes: int = 0
    unparseable: int = 0  # a batch marker on a line the patterns could not read
    out_of_range: int = 0  # outside --since/--until
    untimed: int = 0  # no SGLang timestamp while a time window was asked for


_GRAPH = {b"True, ": True, b"alse, ": False}


def graph_flag(tail: bytes) -> bool | None:
    """The 6 bytes before `gen throughput`; None when the line has no graph flag."""
    return _GRAPH.get(tail)


def _decode(g: tuple[bytes, ...], ts: str | None) -> DecodeBatch:
    accept = float(g[1]) if g[1] else None
    return DecodeBatch(int(g[0]), float(g[3]), _GRAPH.get(g[2]), ts, accept or None)


def _prefill(g: tuple[bytes, ...], ts: str | None) -> PrefillBatch:
    tput = float(g[5]) if g[5] else None
    return PrefillBatch(int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), tput, ts)


def _timestamp(buf: bytes | bytearray, pos: int) -> str | None:
    start = buf.rfind(b"\n", 0, pos) + 1
    m = TIMESTAMP_RE.search(buf, start, pos)
    return m[1].decode() if m else None


_Build = Callable[[tuple[bytes, ...], str | None], DecodeBatch | PrefillBatch]


def _decode_re(buf: bytes | bytearray, end: int) -> re.Pattern[bytes]:
    return SPEC_DECODE_RE if buf.find(ACCEPT_FIELD, 0, end) >= 0 else DECODE_RE


def parse_line(line: str) -> DecodeBatch | PrefillBatch | None:
    """One line, any prefix; None when it is not a batch line or cannot be read."""
    raw = line.encode(errors="replace")
    kinds: tuple[tuple[re.Pattern[bytes], _Build], ...] = (
        (_decode_re(raw, len(raw)), _decode),
        (PREFILL_RE, _prefill),
    )
    for regex, build in kinds:
        if (m := regex.search(raw)) and m[1] is not None:
            return build(m.groups(b""), _timestamp(raw, m.start()))
    return None


@dataclass(frozen=True)
class TimeWindow:
    """Inclusive bounds as `YYYY-mm-dd HH:MM:SS` strings, which compare in time order."""

    since: str | None = None
    until: str | None = None

    @property
    def active(self) -> bool:
        return self.since is not None or self.until is not None

    def holds(self, ts: str) -> bool:
        return (self.since is None or ts >= self.since) and (self.until is None or ts <= self.until)


ANY_TIME = TimeWindow()


def _chunks(stream: BinaryIO, size: int) -> Iterator[tuple[bytearray, int]]:
    """(buffer, end): whole lines in buffer[:end]. One buffer is read into and reused, so
    nothing is copied but the tail after the last newline, which waits for the next read.
    The buffer is overwritten on the next step: use it before asking for another chunk."""
    buf = bytearray(size)
    view = memoryview(buf)
    filled = 0
    while n := stream.readinto(view[filled:]):  # type: ignore[attr-defined]
        filled += n
        end = buf.rfind(b"\n", 0, filled) + 1
        if end == 0:
            if filled == len(buf):  # one line longer than the buffer: grow it
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            continue
        yield buf, end
        tail = bytes(view[end:filled])
        buf[: len(tail)] = tail
        filled = len(tail)
    if filled:
        yield bytearray(view[:filled]) + b"\n", filled + 1


def scan(
    stream: BinaryIO,
    counts: ScanCounts,
    window: TimeWindow = ANY_TIME,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[DecodeBatch | PrefillBatch | EngineFlags]:
    """Yield the batches of each chunk (start-up flags, decode, then prefill); `counts`
    follows the stream. Start-up lines are not held to the time window: a law inside the
    window was measured under the flags the engine started with, before it."""
    for buf, end in _chunks(stream, chunk_bytes):
        counts.lines += buf.count(b"\n", 0, end)
        counts.bytes += end
        yield from startup_flags(buf, end)
        kinds: tuple[tuple[re.Pattern[bytes], _Build], ...] = (
            (_decode_re(buf, end), _decode),
            (PREFILL_RE, _prefill),
        )
        for regex, build in kinds:
            for m in regex.finditer(buf, 0, end):
                if m[1] is None:
                    counts.unparseable += 1
                    continue
                ts = _timestamp(buf, m.start()) if window.active else None
                if window.active and ts is None:
                    counts.untimed += 1
                elif ts is not None and not window.holds(ts):
                    counts.out_of_range += 1
                else:
                    yield build(m.groups(b""), ts)


# Per (running, graph flag) as logged: [lines, sum tok/s, sum accept/(tok/s), sum accept len,
# lines with accept len]. Keys stay bytes: numbers are converted once per key, not per line.
Cell = list[float]


@dataclass
class DecodeTally:
    """Decode lines of a chunk summed per batch size and graph flag, without a per-line object:
    what `scan_tallies` hands on when no time window asks for each line's timestamp."""

    cells: dict[tuple[bytes, bytes], Cell] = field(default_factory=dict)
    idle: int = 0  # no throughput: no step time to speak of
    unparseable: int = 0


def _tally(found: list[tuple[bytes, ...]], tally: DecodeTally) -> None:
    # The hot loop of a multi-GB read: locals only, one dict lookup and one float() per line
    # (two with an accept len).
    cells = tally.cells
    get = cells.get
    idle = bad = 0
    for running, accept, flag, tps in found:
        if not running:
            bad += 1
            continue
        t = float(tps)
        if t <= 0.0:
            idle += 1
            continue
        c = get((running, flag))
        if c is None:
            c = cells[running, flag] = [0, 0.0, 0.0, 0.0, 0]
        c[0] += 1
        c[1] += t
        if accept and (a := float(accept)) > 0.0:
            c[2] += a / t
            c[3] += a
            c[4] += 1
        else:
            c[2] += 1.0 / t
    tally.idle += idle
    tally.unparseable += bad


def scan_tallies(
    stream: BinaryIO, counts: ScanCounts, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[DecodeTally | PrefillBatch | EngineFlags]:
    """The whole stream without a time window: per chunk its start-up flags, one DecodeTally,
    then its prefills."""
    for buf, end in _chunks(stream, chunk_bytes):
        counts.lines += buf.count(b"\n", 0, end)
        counts.bytes += end
        yield from startup_flags(buf, end)
        if found := _decode_re(buf, end).findall(buf, 0, end):
            tally = DecodeTally()
            _tally(found, tally)
            counts.unparseable += tally.unparseable
            yield tally
        for groups in PREFILL_RE.findall(buf, 0, end):
            if groups[0]:
                yield _prefill(groups, None)
            else:
                counts.unparseable += 1
