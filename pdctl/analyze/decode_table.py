"""The decode scaling table: per running-request count, how fast the decode server went.

Each `Decode batch` line reports the generated tokens per second over the last
`--decode-log-interval` steps. Without speculative decoding every step emits one token per
running request, so steps/s = gen_throughput / running and

    step ms = 1000 * running / gen_throughput

which is what the step-time fit (fit.py) and the sawtooth detector (buckets.py) work on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl.analyze.logparse import DecodeBatch, PrefillBatch


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


@dataclass
class PrefillSummary:
    lines: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    max_queue: int = 0
    tps_sum: float = 0.0
    tps_lines: int = 0

    @property
    def mean_input_tps(self) -> float | None:
        return self.tps_sum / self.tps_lines if self.tps_lines else None


@dataclass
class DecodeTable:
    rows: dict[int, BatchSizeRow] = field(default_factory=dict)
    idle_lines: int = 0  # no running request or no throughput: no step time to speak of
    prefill: PrefillSummary = field(default_factory=PrefillSummary)

    def add(self, batch: DecodeBatch | PrefillBatch) -> None:
        if isinstance(batch, PrefillBatch):
            self._add_prefill(batch)
            return
        if batch.running <= 0 or batch.gen_throughput <= 0:
            self.idle_lines += 1
            return
        row = self.rows.get(batch.running)
        if row is None:
            row = self.rows[batch.running] = BatchSizeRow(batch.running)
        step_ms = 1000.0 * batch.running / batch.gen_throughput
        row.lines += 1
        row.tps_sum += batch.gen_throughput
        if batch.cuda_graph is False:
            row.eager_lines += 1
            row.eager_step_ms_sum += step_ms
        else:
            row.graph_lines += 1
            row.graph_tps_sum += batch.gen_throughput
            row.graph_step_ms_sum += step_ms

    def _add_prefill(self, batch: PrefillBatch) -> None:
        p = self.prefill
        p.lines += 1
        p.new_tokens += batch.new_token
        p.cached_tokens += batch.cached_token
        p.max_queue = max(p.max_queue, batch.queue)
        if batch.input_throughput is not None:
            p.tps_sum += batch.input_throughput
            p.tps_lines += 1

    def sorted_rows(self) -> list[BatchSizeRow]:
        return [self.rows[k] for k in sorted(self.rows)]

    @property
    def decode_lines(self) -> int:
        return sum(r.lines for r in self.rows.values()) + self.idle_lines

    @property
    def max_graph_running(self) -> int | None:
        """The largest batch seen inside a graph: the captured max is at least this."""
        sizes = [r.running for r in self.rows.values() if r.graph_lines]
        return max(sizes) if sizes else None
