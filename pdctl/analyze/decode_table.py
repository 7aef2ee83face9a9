"""The decode scaling table: per running-request count, how fast the decode server went.

Each `Decode batch` line reports the generated tokens per second over the last
`--decode-log-interval` steps. Every step emits `accept len` tokens per running request (one
without speculative decoding), so steps/s = gen_throughput / (running x accept len) and

    step ms = 1000 * running * accept_len / gen_throughput

which is what the step-time fit (fit.py) works on. The sawtooth detector (buckets.py) reads
tok/s, which the accept length scales but does not bend.

A `Prefill batch` line's input throughput is the previous line's new tokens over the time
between the two lines (logparse.py). When the previous line left requests queued, the next
batch started as soon as it finished, so that time is the previous batch's forward time:

    batch ms = 1000 * previous #new-token / input throughput

Those busy pairs are summed per new-token count for the prefill law; an idle gap (nothing
queued) measures waiting, not work, and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl.analyze.logparse import (
    DecodeBatch,
    DecodeTally,
    EngineFlags,
    FlagValue,
    PrefillBatch,
    graph_flag,
)


@dataclass
class BatchSizeRow:
    running: int
    lines: int = 0
    eager_lines: int = 0
    tps_sum: float = 0.0
    graph_lines: int = 0  # lines logged with the graph flag True (or no flag: older releases)
    graph_tps_sum: float = 0.0
    graph_step_ms_sum: float = 0.0
    eager_step_ms_sum: float = 0.0
    accept_sum: float = 0.0
    accept_lines: int = 0  # lines with `accept len` (speculative decoding)

    @property
    def mean_tps(self) -> float:
        return self.tps_sum / self.lines

    @property
    def tps_per_request(self) -> float:
        return self.mean_tps / self.running

    @property
    def graph_mean_tps(self) -> float | None:
        return self.graph_tps_sum / self.graph_lines if self.graph_lines else None

    @property
    def graph_step_ms(self) -> float | None:
        return self.graph_step_ms_sum / self.graph_lines if self.graph_lines else None

    @property
    def eager_step_ms(self) -> float | None:
        return self.eager_step_ms_sum / self.eager_lines if self.eager_lines else None

    @property
    def mean_accept_len(self) -> float | None:
        return self.accept_sum / self.accept_lines if self.accept_lines else None

    def add(
        self,
        graph: bool | None,
        lines: int,
        tps_sum: float,
        steps_sum: float,
        accept_sum: float = 0.0,
        accept_lines: int = 0,
    ) -> None:
        """`steps_sum`: the sum over the lines of accept_len / gen_throughput (seconds per step
        per running request)."""
        step_ms_sum = 1000.0 * self.running * steps_sum
        self.lines += lines
        self.tps_sum += tps_sum
        self.accept_sum += accept_sum
        self.accept_lines += accept_lines
        if graph is False:
            self.eager_lines += lines
            self.eager_step_ms_sum += step_ms_sum
        else:
            self.graph_lines += lines
            self.graph_tps_sum += tps_sum
            self.graph_step_ms_sum += step_ms_sum


def is_health_check(batch: PrefillBatch) -> bool:
    """SGLang's /health (and smg's health checks through it) runs a one-token generation that
    logs `Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0` (observed on 0.5.17,
    tests/fixtures/real/): one line per check, which is no traffic's."""
    return batch.new_seq == 1 and batch.new_token == 1 and batch.cached_token == 0


@dataclass
class PrefillSummary:
    lines: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    max_queue: int = 0
    tps_sum: float = 0.0
    tps_lines: int = 0
    # new-token count -> [busy pairs, sum of batch ms]
    busy: dict[int, list[float]] = field(default_factory=dict)
    last: PrefillBatch | None = None
    health_checks: int = 0  # batches of SGLang's /health generation, not counted as traffic

    @property
    def mean_input_tps(self) -> float | None:
        return self.tps_sum / self.tps_lines if self.tps_lines else None

    @property
    def busy_lines(self) -> int:
        return sum(int(c[0]) for c in self.busy.values())

    def add(self, batch: PrefillBatch) -> None:
        if is_health_check(batch):
            self.health_checks += 1
            return
        self.lines += 1
        self.new_tokens += batch.new_token
        self.cached_tokens += batch.cached_token
        self.max_queue = max(self.max_queue, batch.queue)
        tput = batch.input_throughput
        if tput is not None:
            self.tps_sum += tput
            self.tps_lines += 1
        prev, self.last = self.last, batch
        if prev is not None and prev.queue > 0 and prev.new_token > 0 and tput:
            cell = self.busy.setdefault(prev.new_token, [0, 0.0])
            cell[0] += 1
            cell[1] += 1000.0 * prev.new_token / tput


@dataclass
class DecodeTable:
    rows: dict[int, BatchSizeRow] = field(default_factory=dict)
    idle_lines: int = 0  # no running request or no throughput: no step time to speak of
    prefill: PrefillSummary = field(default_factory=PrefillSummary)
    flags: dict[str, FlagValue] = field(default_factory=dict)  # the latest start-up's

    def add(self, batch: DecodeBatch | PrefillBatch | EngineFlags) -> None:
        if isinstance(batch, EngineFlags):
            self.flags.update(batch.flags)
            return
        if isinstance(batch, PrefillBatch):
            self.prefill.add(batch)
            return
        t = batch.gen_throughput
        if t <= 0:
            self.idle_lines += 1
            return
        accept = batch.accept_len or 0.0
        if (row := self._row(batch.running, 1)) is not None:
            row.add(batch.cuda_graph, 1, t, (accept or 1.0) / t, accept, 1 if accept else 0)

    def merge(self, tally: DecodeTally) -> None:
        self.idle_lines += tally.idle
        for (running, flag), (
            lines,
            tps_sum,
            steps_sum,
            accept_sum,
            accept_lines,
        ) in tally.cells.items():
            n = int(lines)
            if (row := self._row(int(running), n)) is not None:
                row.add(graph_flag(flag), n, tps_sum, steps_sum, accept_sum, int(accept_lines))

    def _row(self, running: int, lines: int) -> BatchSizeRow | None:
        """The row of a batch size; None (the lines counted idle) for an empty batch."""
        if running <= 0:
            self.idle_lines += lines
            return None
        row = self.rows.get(running)
        if row is None:
            row = self.rows[running] = BatchSizeRow(running)
        return row

    def sorted_rows(self) -> list[BatchSizeRow]:
        return [self.rows[k] for k in sorted(self.rows)]

    @property
    def decode_lines(self) -> int:
        return sum(r.lines for r in self.rows.values()) + self.idle_lines

    @property
    def accept_len(self) -> float | None:
        """Mean accept length over the lines that logged one; None without speculation."""
        n = sum(r.accept_lines for r in self.rows.values())
        return sum(r.accept_sum for r in self.rows.values()) / n if n else None

    @property
    def max_graph_running(self) -> int | None:
        """The largest batch seen inside a graph: the captured max is at least this."""
        sizes = [r.running for r in self.rows.values() if r.graph_lines]
        return max(sizes) if sizes else None
