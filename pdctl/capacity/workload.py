"""The workload: a request rate and the input and output lengths, fixed or a distribution.

A distribution comes from a trace file (trace.py) or from a bench result (`pdctl bench` or
bench_serving's --output-file): the per-request `input_lens`/`output_lens` when bench_serving
wrote them (--output-details), else the random dataset's own law, uniform in
[max(len x range_ratio, 1), len].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.bench.results import load
from pdctl.capacity.trace import load_trace
from pdctl.errors import PdctlError

UNIFORM_POINTS = 101  # a uniform length range is represented by this many equally spaced values


@dataclass(frozen=True)
class Workload:
    rate: float  # requests/s
    inputs: list[int]  # equally likely input lengths
    outputs: list[int]  # equally likely output lengths
    source: str  # where the lengths came from, for the report

    @property
    def mean_input(self) -> float:
        return sum(self.inputs) / len(self.inputs)

    @property
    def mean_output(self) -> float:
        return sum(self.outputs) / len(self.outputs)

    @property
    def longest(self) -> int:
        """The longest request, if the longest input met the longest output."""
        return max(self.inputs) + max(self.outputs)


def _uniform(full: int, ratio: float) -> list[int]:
    lo = max(int(full * ratio), 1)
    n = min(UNIFORM_POINTS, full - lo + 1)
    return sorted({round(lo + (full - lo) * i / max(n - 1, 1)) for i in range(n)})


def _lens(row: dict[str, Any], key: str) -> list[int] | None:
    value = row.get(key)
    if isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value):
        return list(value)
    return None


def lengths_from_bench(path: Path) -> tuple[list[int], list[int]]:
    """The last run's lengths in a bench result file."""
    rows = load(path)
    if not rows:
        raise PdctlError(f"{path}: no bench result line")
    row = rows[-1]
    inputs, outputs = _lens(row, "input_lens"), _lens(row, "output_lens")
    if inputs and outputs:
        return inputs, outputs
    full_in, full_out = row.get("random_input_len"), row.get("random_output_len")
    ratio = row.get("random_range_ratio", 1.0)
    if not all(isinstance(v, int) and v > 0 for v in (full_in, full_out)) or not isinstance(
        ratio, int | float
    ):
        raise PdctlError(
            f"{path}: the last result line has neither input_lens/output_lens nor "
            "random_input_len/random_output_len: give --input-len and --output-len"
        )
    assert isinstance(full_in, int) and isinstance(full_out, int)
    return _uniform(full_in, float(ratio)), _uniform(full_out, float(ratio))


def workload(
    rate: float | None,
    input_len: int | None,
    output_len: int | None,
    bench: Path | None,
    context_length: int | None,
    context_source: str,
    trace: Path | None = None,
) -> Workload:
    given = [name for name, v in (("--lengths-from", bench), ("--trace", trace)) if v]
    if input_len is not None or output_len is not None:
        given.append("--input-len/--output-len")
    if len(given) > 1:
        raise PdctlError(f"give one of {' and '.join(given)}, not both")
    if rate is not None and rate <= 0:
        raise PdctlError(f"--rate must be above 0 requests/s, got {rate:g}")
    if trace is not None:
        found = load_trace(trace)
        rate = rate or found.rate
        inputs, outputs, source = found.inputs, found.outputs, str(trace)
    elif bench is not None:
        inputs, outputs = lengths_from_bench(bench)
        source = str(bench)
    elif input_len is None or output_len is None:
        raise PdctlError(
            "give --input-len and --output-len, --lengths-from a bench result or a --trace"
        )
    else:
        inputs, outputs, source = [input_len], [output_len], "fixed"
    if rate is None:
        raise PdctlError("give --rate (a --trace with arrival_s gives its own)")
    load_ = Workload(rate, inputs, outputs, source)
    if context_length is not None and load_.longest > context_length:
        raise PdctlError(
            f"input {max(load_.inputs)} + output {max(load_.outputs)} tokens = {load_.longest} "
            f"is above the context length {context_length} ({context_source})"
        )
    return load_
