"""A workload as a trace file: one JSON object per line, `{"input_len": N, "output_len": M}`,
with `"arrival_s"` (seconds from the trace's start) on every line or on none. With arrivals
the trace also gives the request rate (requests over the time they span), unless --rate
overrides it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.errors import PdctlError
from pdctl.textfile import read_text

MAX_BYTES = 64 << 20
LENGTH_KEYS = ("input_len", "output_len")


@dataclass(frozen=True)
class Trace:
    inputs: list[int]
    outputs: list[int]
    rate: float | None  # requests/s over the arrivals' span; None without arrivals


def _length(row: dict[str, Any], key: str, where: str) -> int:
    value = row.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PdctlError(f"{where}: {key} is {value!r}, not a token count of at least 1")
    return value


def _arrival(row: dict[str, Any], where: str) -> float | None:
    value = row.get("arrival_s")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise PdctlError(f"{where}: arrival_s is {value!r}, not a number of seconds")
    return float(value)


def load_trace(path: Path) -> Trace:
    inputs: list[int] = []
    outputs: list[int] = []
    arrivals: list[float | None] = []
    for n, line in enumerate(read_text(path, MAX_BYTES, "a trace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise PdctlError(f'{where}: not a JSON object ({{"input_len": …, "output_len": …}})')
        inputs.append(_length(row, "input_len", where))
        outputs.append(_length(row, "output_len", where))
        arrival = _arrival(row, where)
        if arrivals and (arrival is None) != (arrivals[-1] is None):
            raise PdctlError(f"{where}: arrival_s must be on every line or on none")
        if arrival is not None and arrivals and arrival < (arrivals[-1] or 0.0):
            raise PdctlError(f"{where}: arrival_s {arrival:g} is before the line above's")
        arrivals.append(arrival)
    if not inputs:
        raise PdctlError(f"{path}: no requests in the trace")
    return Trace(inputs, outputs, _rate(path, [a for a in arrivals if a is not None]))


def _rate(path: Path, arrivals: list[float]) -> float | None:
    if not arrivals:
        return None
    span = arrivals[-1] - arrivals[0]
    if len(arrivals) < 2 or span <= 0:
        raise PdctlError(
            f"{path}: its {len(arrivals)} arrivals span {span:g} s: no rate to read; give --rate"
        )
    return (len(arrivals) - 1) / span
