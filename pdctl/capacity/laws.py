"""The decode and prefill laws, read from `pdctl analyze journal --format json` files.

A decode journal and a prefill journal are usually two units, so two files; one file holding
both laws (a journal of both roles) works too. Each law keeps the engine flags it was
measured under, so the planner can say when it is applied to something else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.capacity.model import DecodeLaw, PrefillLaw
from pdctl.errors import PdctlError

# analyze's JSON keys that make a file analyze output
ANALYZE_KEYS = ("input", "step_time_fit", "prefill", "decode")
MIN_POINTS = 3  # batch sizes a law must be fitted from: two always fit a line exactly
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Laws:
    decode: DecodeLaw
    prefill: PrefillLaw
    decode_source: Path
    prefill_source: Path
    decode_flags: dict[str, Any] = field(default_factory=dict)
    prefill_flags: dict[str, Any] = field(default_factory=dict)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)  # analyze's JSON is kilobytes: a bigger file is not it
    except OSError as e:
        raise PdctlError(f"{path}: {e.strerror}") from None
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or any(k not in data for k in ANALYZE_KEYS):
        raise PdctlError(f"{path}: not `pdctl analyze journal --format json` output")
    return data


def _number(fit: dict[str, Any], key: str, path: Path, what: str) -> float:
    value = fit.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise PdctlError(f"{path}: {what} {key} is {value!r}, not a number")
    return float(value)


def _one(
    found: list[tuple[Path, dict[str, Any]]], what: str, hint: str
) -> tuple[Path, dict[str, Any]]:
    if len(found) > 1:
        names = " and ".join(str(p) for p, _ in found)
        raise PdctlError(f"{names} both hold a {what} law: give one of them")
    if not found:
        raise PdctlError(f"no {what} law in the files given: {hint}")
    return found[0]


def _check_points(path: Path, fit: dict[str, Any], what: str, unit: str) -> None:
    points = fit.get("points")
    if not isinstance(points, int) or points < MIN_POINTS:
        raise PdctlError(
            f"{path}: the {what} law was fitted at {points} {unit}; "
            f"capacity needs at least {MIN_POINTS}"
        )


def load_laws(paths: Sequence[Path]) -> Laws:
    files = [(p, _read(p)) for p in paths]
    decodes = [(p, d) for p, d in files if d["step_time_fit"] is not None]
    prefills = [(p, d) for p, d in files if (d["prefill"] or {}).get("fit") is not None]
    no_decode = "; ".join(f"{p} has {len(d['decode'])} batch sizes in graph mode" for p, d in files)
    d_path, d_data = _one(decodes, "decode", f"{no_decode} (a law needs {MIN_POINTS})")
    no_prefill = "; ".join(
        f"{p} has {(d['prefill'] or {}).get('busy_lines', 0)} back-to-back prefill batches"
        for p, d in files
    )
    p_path, p_data = _one(
        prefills, "prefill", f"{no_prefill} (a law needs them at {MIN_POINTS} sizes)"
    )
    dfit, pfit = d_data["step_time_fit"], p_data["prefill"]["fit"]
    _check_points(d_path, dfit, "decode", "batch sizes")
    _check_points(p_path, pfit, "prefill", "new-token counts")
    decode = DecodeLaw(
        _number(dfit, "a_ms", d_path, "decode"),
        _number(dfit, "b_ms", d_path, "decode"),
        float(dfit.get("accept_len") or 1.0),
    )
    prefill = PrefillLaw(
        _number(pfit, "a_ms", p_path, "prefill"), _number(pfit, "b_ms", p_path, "prefill")
    )
    for path, law, what in ((d_path, decode, "decode"), (p_path, prefill, "prefill")):
        if law.b_ms <= 0 or law.a_ms < 0:
            raise PdctlError(
                f"{path}: the {what} law ({law.a_ms:.3g} ms + {law.b_ms:.3g} ms per unit) "
                "does not grow with the load: it cannot size anything"
            )
    return Laws(
        decode,
        prefill,
        d_path,
        p_path,
        dict(d_data.get("engine_flags") or {}),
        dict(p_data.get("engine_flags") or {}),
    )
