"""The sglang driver: sglang's bench_serving from an SGLang venv, one run per level.

bench_serving runs through judged_bench_serving.py, which applies pdctl's failure rule
(stream.py) to each request before bench_serving counts it; its own warm-up request, timing
and metric code are used unchanged: this driver is the reference the builtin one is checked
against on GPU hosts. bench_serving appends one JSON line per run to its --output-file; each
run gets a fresh file in a private directory, so the line read back is this level's.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from pdctl.bench.level import BACKENDS, Level, Target
from pdctl.errors import PdctlError

STOP_GRACE_S = 10.0
# bench_serving's completions payload carries `best_of: 1`, which the smg 1.13 gateway
# rejects on streamed requests (HTTP 400); a null overrides it and passes.
NO_BEST_OF = '{"best_of": null}'
LOG_TAIL = 2000
JUDGE = Path(__file__).with_name("judged_bench_serving.py")


def bench_serving_command(
    python: str, target: Target, level: Level, output_file: Path, extra_args: str = ""
) -> list[str]:
    extra = shlex.split(extra_args)
    if target.endpoint == "completions" and "--extra-request-body" not in extra:
        extra += ["--extra-request-body", NO_BEST_OF]
    return [
        python, str(JUDGE),
        "--backend", BACKENDS[target.endpoint],
        "--base-url", target.url,
        "--model", target.model,
        "--dataset-name", "random",
        "--random-input-len", str(level.input_len),
        "--random-output-len", str(level.output_len),
        "--random-range-ratio", str(level.range_ratio),
        "--num-prompts", str(level.num_prompts),
        *(["--max-concurrency", str(level.concurrency)] if level.concurrency else []),
        *(["--request-rate", str(level.rate)] if level.rate is not None else []),
        "--seed", str(level.seed),
        "--output-file", str(output_file),
        "--disable-tqdm",
        *extra,
    ]  # fmt: skip


def _env(target: Target) -> dict[str, str] | None:
    """bench_serving sends $OPENAI_API_KEY as `Authorization: Bearer` (never on its argv)."""
    return {**os.environ, "OPENAI_API_KEY": target.api_key} if target.api_key else None


async def run_level(
    python: str, target: Target, level: Level, extra_args: str = ""
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pdctl-bench-") as tmp:
        out = Path(tmp) / "result.jsonl"
        log = Path(tmp) / "bench_serving.log"
        cmd = bench_serving_command(python, target, level, out, extra_args)
        with log.open("wb") as log_f:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *cmd, stdout=log_f, stderr=log_f, env=_env(target)
                )
            except OSError as e:
                raise PdctlError(f"cannot run {python}: {e.strerror}") from e
            try:
                rc = await proc.wait()
            except asyncio.CancelledError:
                # The level timed out: stop our child by its PID, then give up on it.
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                raise
        tail = log.read_text(errors="replace")[-LOG_TAIL:]
        if rc != 0 or not out.exists():
            raise PdctlError(f"{shlex.join(cmd)} exited {rc}:\n{tail}")
        lines = out.read_text().splitlines()
        if not lines:
            raise PdctlError(f"bench_serving wrote no result:\n{tail}")
        result: dict[str, Any] = json.loads(lines[-1])
        failures = Path(f"{out}.failures.json")
        errors = json.loads(failures.read_text())["errors"] if failures.exists() else []
    # bench_serving counts as completed only what passed the judge.
    return result | {"failed": level.num_prompts - int(result["completed"]), "errors": errors}
