"""CUDA-graph buckets seen from the journal: the sawtooth, eager overflow, a better list.

SGLang pads a decode batch up to the next captured graph size. Within one bucket the step
costs the same, so aggregate tok/s rises with every added request — until the batch crosses a
bucket size k and pays for the next bucket's padding: tok/s at k+1 falls below tok/s at k.
Those falls mark the captured sizes (the seed saw it between 56 and 57 with buckets of 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdctl.analyze.decode_table import DecodeTable

# sglang 0.5.23's default decode list (arg_groups/cuda_graph_hook.py) is 1, 2, 4, 8, 12, then
# every 8 up to 256: the recommendation keeps that shape and refines it.
SMALL_GRAPHS = (1, 2, 4, 12)
COARSE_STEP = 8
# A segment carrying this many times its even share of the decode lines earns finer graphs.
DENSE = 2.0
MEDIUM = 1.25


@dataclass(frozen=True)
class SawtoothDrop:
    boundary: int  # the bucket size k: throughput at k+1 is lower
    tps_at: float
    tps_after: float

    @property
    def drop_pct(self) -> float:
        return 100.0 * (self.tps_at - self.tps_after) / self.tps_at


def find_sawtooth(
    table: DecodeTable, min_lines: int = 5, min_drop: float = 0.02
) -> list[SawtoothDrop]:
    """Falls in graph-mode tok/s between adjacent batch sizes with enough lines each."""
    tps = {
        r.running: m
        for r in table.sorted_rows()
        if r.graph_lines >= min_lines and (m := r.graph_mean_tps) is not None
    }
    return [
        SawtoothDrop(k, tps[k], tps[k + 1])
        for k in sorted(tps)
        if k + 1 in tps and tps[k + 1] < tps[k] * (1.0 - min_drop)
    ]


@dataclass(frozen=True)
class EagerOverflow:
    """Decode steps that ran eager because the batch outgrew every captured graph."""

    max_graph: int
    lines: int
    largest_batch: int


def eager_overflow(table: DecodeTable, max_graph: int | None) -> EagerOverflow | None:
    if max_graph is None:
        return None
    over = [r for r in table.sorted_rows() if r.running > max_graph and r.eager_lines]
    if not over:
        return None
    return EagerOverflow(max_graph, sum(r.eager_lines for r in over), over[-1].running)


def recommend_buckets(table: DecodeTable, max_graph: int | None) -> list[int]:
    """A `--cuda-graph-bs-decode` list: coarse everywhere, fine where the traffic sits.

    The top covers both the current max and the largest batch seen (rounded up to 8), so no
    observed batch would run eager. An 8-wide segment holding twice its even share of the
    decode lines gets a graph per batch size, 1.25x one every 2: each graph costs capture time
    and memory, so they go where the batches actually are.
    """
    lines = {r.running: r.lines for r in table.sorted_rows()}
    if not lines:
        return []
    top = max(max(lines), max_graph or 0)
    top = COARSE_STEP * math.ceil(top / COARSE_STEP)
    even = sum(lines.values()) * COARSE_STEP / top
    sizes = {b for b in SMALL_GRAPHS if b <= top} | set(range(COARSE_STEP, top + 1, COARSE_STEP))
    for hi in range(COARSE_STEP, top + 1, COARSE_STEP):
        lo = hi - COARSE_STEP
        load = sum(n for bs, n in lines.items() if lo < bs <= hi) / even
        step = 1 if load >= DENSE else 2 if load >= MEDIUM else 0
        if step:
            sizes.update(range(lo + step, hi, step))
    return sorted(sizes)


def padded(batch: int, buckets: list[int]) -> int:
    """The graph a batch runs in (itself when it is above every bucket: eager)."""
    return next((b for b in buckets if b >= batch), batch)
