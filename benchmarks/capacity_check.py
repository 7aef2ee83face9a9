"""`pdctl capacity`'s predictions against the simulated stack, for three workloads.

For each workload (prefill-heavy, decode-heavy, mixed): plant a decode law and a prefill law
in the sim (PDSIM_STEP_A_MS/B_MS, PDSIM_PREFILL_BASE_MS/MS_PER_TOKEN), write the laws as
`pdctl analyze journal` reads them from journals generated with the same law
(pdctl.analyze.synth), plan the layout, bring it up as local processes (sim engines with the
recommended --max-running-requests and --cuda-graph-bs-decode behind the real smg gateway
with the profile's round_robin policy), drive it open loop with `pdctl bench sweep --rate`'s
driver (Poisson arrivals at the rate) and print predicted against measured TTFT p90, ITL p90
and output tok/s. The fixed PD handoff the planner is given is measured first, as an
operator would: requests one at a time through an idle 1P+1D, mean TTFT less the prefill law
and the KV transfer (the sim's KV bytes per token at its link speed).
Output tok/s is measured over the arrival window (tokens whose time falls between the first
and the last arrival), the steady state the prediction describes. `--time-scale S` runs the
sim S times slower than its law (PDSIM_TIME_SCALE), sends at rate / S and divides measured
times by S: on a loaded machine it keeps the engines' event loops from falling behind their
law, and shrinks the gateway's and client's own overhead by S too. `--seeds K` drives each
workload K times on its layout with their own arrival seeds and pools them; next to the
measured TTFT p90 it prints the model's own 5-95 % band for that many arrivals and the model
replayed on the runs' arrivals. Engines and the gateway are stopped by PID.

    .venv/bin/python benchmarks/capacity_check.py [--only prefill-heavy|decode-heavy|mixed]
        [--seeds K] [--time-scale S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import random
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

from pdctl.analyze.report import analyze_stream
from pdctl.analyze.synth import SynthJournal, SynthPrefill, journal_lines, prefill_journal_lines
from pdctl.bench.builtin import arrival_times, run_alone
from pdctl.bench.client import RequestOutput
from pdctl.bench.level import Level, Target
from pdctl.bench.metrics import calculate, window_tokens
from pdctl.capacity.laws import load_laws
from pdctl.capacity.model import StepInProgress, sample_quantile
from pdctl.capacity.prefill import Handoff, PrefillSide, replay
from pdctl.capacity.search import Engines, Option, Shape, Targets, plan
from pdctl.capacity.workload import Workload
from pdctl.sim.args import Knobs
from pdctl.sim.conn import KV_TRANSFER_GB_S
from pdctl.testing.stack import Gateway, SimProc, served_model, smg_binary, start_gateway

LAW = {"PDSIM_STEP_A_MS": 18.0, "PDSIM_STEP_B_MS": 1.05,
       "PDSIM_PREFILL_BASE_MS": 5.0, "PDSIM_PREFILL_MS_PER_TOKEN": 0.05}  # fmt: skip
CHUNK = 8192
ENGINE_ARGS = ("--mem-fraction-static", "0.60", "--context-length", "8192",
               "--chunked-prefill-size", str(CHUNK))  # fmt: skip
CALIBRATION_REQUESTS = 20
FIRST_SEED = 7  # the arrival seed of a workload's first run; the next runs count up from it
BAND_DRAWS = 200
BAND_SEED = 22
# The sim moves KV_BYTES_PER_TOKEN per prompt token at KV_TRANSFER_GB_S (conn.py).
TRANSFER = Handoff.of(0.0, Knobs().kv_bytes_per_token, KV_TRANSFER_GB_S)


@dataclass(frozen=True)
class Case:
    name: str
    rate: float
    input_len: int
    output_len: int
    requests: int
    ttft_p90_ms: float
    itl_p90_ms: float


CASES = (
    Case("prefill-heavy", 6.0, 4096, 32, 240, 1500.0, 50.0),
    Case("decode-heavy", 1.5, 128, 512, 150, 1000.0, 50.0),
    Case("mixed", 3.0, 1024, 256, 180, 1000.0, 50.0),
)


def write_laws(root: Path) -> list[Path]:
    """The planted laws as analyze output, from journals generated with them."""
    decode = "".join(
        journal_lines(
            SynthJournal(a_ms=LAW["PDSIM_STEP_A_MS"], b_ms=LAW["PDSIM_STEP_B_MS"]), 20_000
        )
    )
    prefill = "".join(
        prefill_journal_lines(
            SynthPrefill(a_ms=LAW["PDSIM_PREFILL_BASE_MS"], b_ms=LAW["PDSIM_PREFILL_MS_PER_TOKEN"]),
            2_000,
        )
    )
    paths = []
    for name, text in (("decode", decode), ("prefill", prefill)):
        path = root / f"{name}.json"
        path.write_text(json.dumps(analyze_stream(io.BytesIO(text.encode())).as_dict()))
        paths.append(path)
    return paths


async def drive(url: str, model: str, level: Level) -> tuple[list[RequestOutput], float, float]:
    """`pdctl bench sweep`'s builtin driver (a warm-up, then the level); the outputs, the
    first and the last arrival (perf_counter seconds)."""
    outputs, start, _ = await run_alone(Target(url, model, "chat"), level)
    return outputs, start, start + arrival_times(level)[-1]


@contextlib.contextmanager
def layout(
    binary: str, logs: Path, scale: float, prefills: int, decodes: int, decode_args: Sequence[str]
) -> Iterator[tuple[str, str]]:
    """Sim engines behind smg; (gateway URL, model). Stopped by PID on the way out."""
    env = {"PDSIM_STARTUP_DELAY_S": "1", "PDSIM_TIME_SCALE": str(scale)} | {
        k: str(v) for k, v in LAW.items()
    }
    sims = [SimProc.create("prefill", logs, env, extra=ENGINE_ARGS) for _ in range(prefills)]
    decode_sims = [SimProc.create("decode", logs, env, extra=decode_args) for _ in range(decodes)]
    gateway: Gateway | None = None
    try:
        for sim in (*sims, *decode_sims):
            sim.start()
        for sim in (*sims, *decode_sims):
            sim.wait_healthy(60)
        # round_robin: the profile's router policy, and what the planner assumes; health
        # checks that tolerate a loaded machine (one slow /health must not empty the pool)
        gateway = start_gateway(
            binary, sims, decode_sims, logs, "--disable-retries", "--policy", "round_robin",
            "--health-failure-threshold", "5", "--health-check-timeout-secs", "10",
        )  # fmt: skip
        gateway.wait_ready()
        yield gateway.url, served_model(gateway.url)
    finally:
        if gateway is not None:
            gateway.stop()
        for sim in (*sims, *decode_sims):
            sim.stop()


def calibrate_handoff(binary: str, logs: Path, scale: float) -> float:
    """The fixed handoff as an operator would measure it (docs/bench.md): requests one at a
    time through one idle pair, mean TTFT less the prefill law and the KV transfer at their
    prompt length."""
    input_len = 128
    level = Level(1, CALIBRATION_REQUESTS, input_len, 8, 1.0, 3)
    with layout(binary, logs, scale, 1, 1, ENGINE_ARGS) as (url, model):
        outputs, _, _ = asyncio.run(drive(url, model, level))
    ttft = [o.ttft * 1000 / scale for o in outputs if o.success]
    prefill = LAW["PDSIM_PREFILL_BASE_MS"] + LAW["PDSIM_PREFILL_MS_PER_TOKEN"] * input_len
    return max(statistics.mean(ttft) - prefill - TRANSFER.ms(input_len), 0.0)


def model_band(
    side: PrefillSide, step: StepInProgress, case: Case, prefills: int, seeds: int
) -> tuple[float, float]:
    """The 5 % and 95 % points of the model's own TTFT p90 over BAND_DRAWS runs like the
    benchmark's (`seeds` Poisson sequences of case.requests, pooled): how far a measured p90
    may stray from the long-run prediction by the luck of the arrivals alone."""
    rng = random.Random(BAND_SEED)
    p90s = []
    for _ in range(BAND_DRAWS):
        pooled: list[float] = []
        for _ in range(seeds):
            gaps = (rng.expovariate(case.rate / 1000.0) for _ in range(case.requests - 1))
            at_ms = [0.0, *accumulate(gaps)]
            inputs = [case.input_len] * len(at_ms)
            pooled += replay(side, at_ms, inputs, prefills, step, seed=str(rng.random()))
        p90s.append(sample_quantile(sorted(pooled), 0.9))
    p90s.sort()
    return sample_quantile(p90s, 0.05), sample_quantile(p90s, 0.95)


def run_case(
    case: Case,
    laws: list[Path],
    logs: Path,
    binary: str,
    scale: float,
    handoff_ms: float,
    seeds: int,
) -> dict[str, float]:
    load = Workload(case.rate, [case.input_len], [case.output_len], "fixed")
    targets = Targets({0.9: case.ttft_p90_ms}, {0.9: case.itl_p90_ms})
    engines = Engines(CHUNK, Handoff(handoff_ms, TRANSFER.ms_per_token))
    found = load_laws(laws)
    best: Option = plan(found, load, targets, Shape(4, 4), None, engines).recommended
    decode_args = (*ENGINE_ARGS, "--max-running-requests", str(best.buckets.cap),
                   "--cuda-graph-bs-decode", *map(str, best.buckets.sizes))  # fmt: skip
    rate = case.rate / scale
    shape = (case.requests, case.input_len, case.output_len, 1.0)
    levels = [Level(None, *shape, FIRST_SEED + k, rate) for k in range(seeds)]
    runs = []
    with layout(binary, logs, scale, best.prefill_instances, best.decode_instances,
                decode_args) as (url, model):  # fmt: skip
        for level in levels:  # one after the other: each drains before the next starts
            runs.append(asyncio.run(drive(url, model, level)))
    outputs = [o for run, _, _ in runs for o in run]
    ok = [o for o in outputs if o.success]
    for o in outputs:
        if not o.success:
            print(f"  {case.name}: failed: {o.error}", file=sys.stderr)
    # the model on these runs' own arrivals: how much of a miss is the sample's luck
    side = PrefillSide(found.prefill, engines.chunk_tokens, engines.handoff)
    step = StepInProgress.of(found.decode, best.buckets.sizes, best.decode.mean_running)
    replayed: list[float] = []
    for level in levels:
        at_ms = [t * 1000.0 / scale for t in arrival_times(level)]
        inputs = [case.input_len] * len(at_ms)
        replayed += replay(side, at_ms, inputs, best.prefill_instances, step)
    tokens = sum(window_tokens(run, first, last) for run, first, last in runs)
    window = sum(last - first for _, first, last in runs)
    result = calculate(outputs, window)  # pdctl bench's percentiles over the pooled runs
    low, high = model_band(side, step, case, best.prefill_instances, seeds)
    return {
        "prefills": best.prefill_instances,
        "decodes": best.decode_instances,
        "cap": best.buckets.cap,
        "requests": len(outputs),
        "failed": len(outputs) - len(ok),
        "ttft_pred": best.prefill.ttft_ms[0.9],
        "ttft_low": low,
        "ttft_high": high,
        "ttft_replay": sample_quantile(sorted(replayed), 0.9),
        "ttft_meas": result["p90_ttft_ms"] / scale,
        "itl_pred": best.decode.itl_ms[0.9],
        "itl_meas": result["p90_itl_ms"] / scale,
        "tok_pred": best.output_tok_s,
        "tok_meas": tokens / window * scale,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=[c.name for c in CASES], action="append")
    ap.add_argument("--time-scale", type=float, default=1.0, help="PDSIM_TIME_SCALE")
    ap.add_argument(
        "--requests-factor", type=float, default=1.0,
        help="run each workload this many times longer (a p90 of 240 requests spreads +-20%%)",
    )  # fmt: skip
    ap.add_argument(
        "--seeds", type=int, default=1,
        help="runs per workload with their own arrival seeds, pooled (on one layout)",
    )  # fmt: skip
    args = ap.parse_args()
    # a SIGTERM unwinds through the finally blocks that stop the engines and the gateway
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    binary = smg_binary()
    if binary is None:
        print("smg is not installed (scripts/setup.sh installs it into .venv)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pdctl-capacity-") as tmp:
        root = Path(tmp)
        laws = write_laws(root)
        handoff_ms = calibrate_handoff(binary, root, args.time_scale)
        print(f"handoff at idle (1P+1D, one request at a time): {handoff_ms:.1f} ms", flush=True)
        print(f"{'workload':14} {'P+D':>5} {'cap':>4} {'reqs':>5} {'fail':>4}  "
              f"{'TTFT p90 pred/meas':>20}  {'model 5-95%':>13}  {'replayed/meas':>20}  "
              f"{'ITL p90 pred/meas':>19}  {'out tok/s pred/meas':>21}")  # fmt: skip
        for case in CASES:
            if args.only and case.name not in args.only:
                continue
            longer = replace(case, requests=round(case.requests * args.requests_factor))
            r = run_case(longer, laws, root, binary, args.time_scale, handoff_ms, args.seeds)

            def pair(pred: float, meas: float) -> str:
                return f"{pred:7.1f}/{meas:7.1f} {100 * (meas - pred) / pred:+4.0f}%"

            band = f"{r['ttft_low']:6.1f}-{r['ttft_high']:<6.1f}"
            cells = [pair(r["ttft_pred"], r["ttft_meas"]), band,
                     pair(r["ttft_replay"], r["ttft_meas"]), pair(r["itl_pred"], r["itl_meas"]),
                     pair(r["tok_pred"], r["tok_meas"])]  # fmt: skip
            head = f"{case.name:14} {r['prefills']:.0f}+{r['decodes']:.0f}".ljust(20)
            counts = f"{r['cap']:>4.0f} {r['requests']:>5.0f} {r['failed']:>4.0f}"
            print(f"{head} {counts}  {'  '.join(cells)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
