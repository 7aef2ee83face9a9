"""Sweep result lines: bench_serving's fields plus ours, written whole or not at all."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdctl.analyze.fit import LinearFit, linear_fit
from pdctl.bench.compare import COMPARED
from pdctl.bench.level import BACKENDS, Level, Target
from pdctl.errors import PdctlError
from pdctl.textfile import read_text

MAX_BYTES = 64 << 20  # one line per level: a real sweep is kilobytes
# Fields compare and the TPOT fit compute with.
NUMERIC = ("completed", "mean_tpot_ms", *(f for f, _, _ in COMPARED))


def header(target: Target, level: Level) -> dict[str, Any]:
    """The argument part of bench_serving's result dict."""
    return {
        "tag": None,
        "backend": BACKENDS[target.endpoint],
        "dataset_name": "random",
        "request_rate": float("inf") if level.rate is None else level.rate,
        "max_concurrency": level.concurrency,
        "sharegpt_output_len": None,
        "random_input_len": level.input_len,
        "random_output_len": level.output_len,
        "random_range_ratio": level.range_ratio,
    }


def write_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """A reader (or a crash) sees the previous complete file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def load(path: Path) -> list[dict[str, Any]]:
    """A sweep's lines, or bench_serving's own --output-file (Infinity included)."""
    rows = []
    for n, line in enumerate(read_text(path, MAX_BYTES, "a sweep result file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise PdctlError(f"{path}:{n}: not JSON ({e})") from e
        if not isinstance(row, dict) or "max_concurrency" not in row:
            raise PdctlError(f"{path}:{n}: not a bench_serving result line")
        bad = [k for k in NUMERIC if row.get(k) is not None and not _number(row[k])]
        # an open-loop run (a finite request_rate) may leave the concurrency uncapped
        open_loop = row["max_concurrency"] is None and _number(row.get("request_rate"))
        if bad or not (open_loop or isinstance(row["max_concurrency"], int)):
            field = bad[0] if bad else "max_concurrency"
            raise PdctlError(f"{path}:{n}: {field} is {row[field]!r}, not a number")
        rows.append(row)
    return rows


def tpot_fit(rows: Sequence[dict[str, Any]]) -> LinearFit | None:
    """TPOT = a + b·C over the levels: with C requests decoding together a step is a TPOT,
    so b is the per-request step cost and 1000/b tok/s the ceiling (fit.py)."""
    return linear_fit(
        [
            (float(r["max_concurrency"]), float(r["mean_tpot_ms"]), 1.0)
            for r in rows
            if r.get("max_concurrency") and r.get("completed")
        ]
    )
