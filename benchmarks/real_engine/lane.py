"""The GPU lane's driver (run.sh sets up the bundle and calls it): a real SGLang prefill and
decode started from `pdctl render`'s launch lines, smg from its rendered line, the pair
registered through pdctl's gateway code, then pdstack against them through the local-process
seam the integration tests use (pdctl.testing.localproc): status, the pair canary, traffic
through the gateway, a short `pdctl bench sweep`, `restart --both`, `pdctl analyze journal`
on the engines' logs. Each step's outcome goes to OUT/steps.json and what the engines said
to OUT/record/sglang-<version>/ (record.py); a failed step is recorded and the lane goes on
where it can.

    python3 benchmarks/real_engine/lane.py --out DIR [--inventory INI]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record

from pdctl.cli.status_view import to_json
from pdctl.ops.context import Timeouts
from pdctl.ops.restart import register_pair, restart_pair
from pdctl.ops.status import collect
from pdctl.pdclient import pair_canary
from pdctl.testing.localproc import LocalPair, local_ops
from pdctl.testing.stack import Gateway, SimProc, stop_pid

HERE = Path(__file__).resolve().parent
INVENTORY = HERE / "inventory.ini"
PDCTL = [sys.executable, "-c", "from pdctl.cli import main; main()"]
# A real engine takes about 2 minutes to its first /health 200 (Triton's first compiles).
STARTUP_S = 420.0
TIMEOUTS = Timeouts(drain=30, health=STARTUP_S, canary=120, register=60, poll=0.5)


class EngineProc(SimProc):
    """A real engine as its unit runs it: its own process group (the main process, the
    scheduler, the detokenizer, a resource tracker), stopped as KillMode=mixed stops a unit:
    SIGTERM to the main process, SIGKILL to every process left after the grace."""

    started_at: float = 0.0

    def start(self) -> EngineProc:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        self.started_at = time.monotonic()
        return self

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # a session leader's group id is its PID
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGTERM)
        if not _group_gone(self.proc, grace):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            _group_gone(self.proc, 10.0)


def _group_gone(leader: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether every process of the leader's group has exited (the leader reaped here, the
    others by init once the leader is gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader.poll()  # an unreaped leader keeps the group alive as a zombie
        try:
            os.killpg(leader.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def pdctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PDCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


class Lane:
    def __init__(self, out: Path, inventory: Path) -> None:
        self.out, self.inventory = out, inventory
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.steps: dict[str, dict[str, Any]] = {}
        self.rec = record.Record()
        self.t0 = time.monotonic()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[dict[str, Any]]:
        """A step's outcome (ok, seconds, what it noted) in steps.json; a failure is noted
        and does not stop the lane."""
        note: dict[str, Any] = {}
        t = time.monotonic()
        print(f"lane: {name} ({t - self.t0:.0f} s in)", flush=True)
        try:
            yield note
            note["ok"] = True
        except Exception as e:  # every failure is the record's business
            note.update(ok=False, error=f"{type(e).__name__}: {e}")
            traceback.print_exc()
        note["seconds"] = round(time.monotonic() - t, 2)
        self.steps[name] = note
        (self.out / "steps.json").write_text(json.dumps(self.steps, indent=2, default=str))


def rendered(lane: Lane, pre_rendered: Path | None) -> dict[str, Any]:
    """`pdctl render --format json` of the inventory, or that output rendered beforehand
    where pdctl can read an inventory (a GPU machine without ansible-core cannot: run.sh's
    PDSTACK_RENDERED)."""
    if pre_rendered is not None:
        text = pre_rendered.read_text()
        (lane.logs / "render.json").write_text(text)
        return dict(json.loads(text))
    r = pdctl("render", "-i", str(lane.inventory), "--format", "json")
    if r.returncode:
        raise RuntimeError(f"pdctl render failed: {r.stderr[-2000:]}")
    (lane.logs / "render.json").write_text(r.stdout)
    v = pdctl("validate", "-i", str(lane.inventory))
    (lane.logs / "validate.txt").write_text(v.stdout + v.stderr)
    return dict(json.loads(r.stdout))


def engine(inst: dict[str, Any], logs: Path) -> EngineProc:
    """The rendered ExecStart without numactl and the host's venv: this machine's Python
    runs the module with the rendered arguments and environment."""
    cmd = inst["command"]
    at = cmd.index("-m")
    args = cmd[at + 2 :]
    mode = args[args.index("--disaggregation-mode") + 1]
    port = int(args[args.index("--port") + 1])
    boot = int(args[args.index("--disaggregation-bootstrap-port") + 1]) if mode == "prefill" else 0
    return EngineProc(
        mode, port, boot, logs / f"{mode}.log",
        [sys.executable, "-m", cmd[at + 1], *args], {**os.environ, **inst["environment"]},
    )  # fmt: skip


def wait_healthy(engines: list[EngineProc]) -> dict[str, float]:
    """Seconds from each engine's start to its first /health 200."""
    ready: dict[str, float] = {}
    deadline = time.monotonic() + STARTUP_S
    while len(ready) < len(engines) and time.monotonic() < deadline:
        for e in engines:
            if e.mode in ready:
                continue
            if e.proc is not None and e.proc.poll() is not None:
                raise RuntimeError(f"{e.mode} exited {e.proc.returncode}: {e.log_text()[-3000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{e.url}/health", timeout=5).status_code == 200:
                    ready[e.mode] = round(time.monotonic() - e.started_at, 1)
        time.sleep(0.5)
    if len(ready) < len(engines):
        raise TimeoutError(f"engines not healthy after {STARTUP_S:.0f} s: ready {ready}")
    return ready


def start_gateway(args: list[str], logs: Path) -> Gateway:
    port = int(args[args.index("--port") + 1])
    metrics = int(args[args.index("--prometheus-port") + 1])
    log = logs / "smg.log"
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smg", *args], stdout=f, stderr=subprocess.STDOUT
        )
    gw = Gateway(port, metrics, log, proc)
    if not gw.wait_listening(60):
        raise RuntimeError(f"smg did not listen: {log.read_text(errors='replace')[-2000:]}")
    return gw


def timed_canary(pair: LocalPair, count: int) -> dict[str, Any]:
    c = pair_canary(pair.prefill.url, pair.decode.url, pair.prefill.bootstrap_port, count, 60)
    return asdict(c)


def gateway_traffic(gw: Gateway, model: str) -> dict[str, Any]:
    """One request of each kind through smg; status and the answer's start."""
    bodies: dict[str, tuple[str, dict[str, Any]]] = {
        "generate": ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 8}}),
        "chat": (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        ),
        "completions": ("/v1/completions", {"model": model, "prompt": "once", "max_tokens": 8}),
    }
    out = {}
    for kind, (path, body) in bodies.items():
        r = requests.post(f"{gw.url}{path}", json=body, timeout=120)
        out[kind] = {"status": r.status_code, "body": r.text[:2000]}
    return out


def bench(lane: Lane, gw: Gateway, decode: EngineProc) -> dict[str, Any]:
    out = lane.logs / "bench.jsonl"
    r = pdctl(
        "bench", "sweep", "--url", gw.url, "--concurrency", "1,8", "--input-len", "128",
        "--output-len", "64", "--num-prompts", "16", "--metrics-url", f"{decode.url}/metrics",
        "--output-file", str(out), "--format", "json", "--timeout", "120", timeout=300,
    )  # fmt: skip
    (lane.logs / "bench.txt").write_text(r.stdout + r.stderr)
    if r.returncode:
        raise RuntimeError(f"pdctl bench sweep exited {r.returncode}: {r.stderr[-2000:]}")
    return {"levels": [json.loads(x) for x in out.read_text().splitlines() if x.strip()]}


def analyze(lane: Lane, eng: EngineProc) -> dict[str, Any]:
    r = pdctl("analyze", "journal", "--file", str(eng.log_path), "--format", "json")
    (lane.logs / f"analyze-{eng.mode}.txt").write_text(r.stdout + r.stderr)
    if r.returncode:
        raise RuntimeError(f"analyze journal exited {r.returncode}: {r.stderr[-1000:]}")
    return dict(json.loads(r.stdout))


def restart_both(lane: Lane, ops: Any, note: dict[str, Any]) -> None:
    (pair,) = ops.source.pairs()
    rep = restart_pair(ops, pair)
    p = rep.phases
    note.update(ok_report=rep.ok, error_report=rep.error, phases_s=p)
    # The first stop to the first request through the pair (benchmarks/restart_both.py).
    note["downtime_s"] = round(sum(p.get(k, 0.0) for k in ("stop", "start", "health", "canary")), 2)
    if not rep.ok:
        raise RuntimeError(f"restart --both failed: {rep.error}")


def run(lane: Lane, pre_rendered: Path | None) -> None:
    rec = lane.rec
    with lane.step("render") as n:
        spec = rendered(lane, pre_rendered)
        n["gateway_args"] = spec["gateway"]["args"]
    first = spec["instances"][0]["command"]
    model_dir = Path(first[first.index("--model-path") + 1])
    with lane.step("tiny-model"):
        subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(model_dir)], check=True)
    engines = [engine(i, lane.logs) for i in spec["instances"]]
    prefill, decode = sorted(engines, key=lambda e: e.mode != "prefill")
    pair = LocalPair("pd0", prefill, decode)
    gw: Gateway | None = None
    try:
        with lane.step("start-engines") as n:
            for e in engines:
                e.start()
            n["startup_s"] = wait_healthy(engines)
        with lane.step("gateway") as n:
            gw = start_gateway(spec["gateway"]["args"], lane.logs)
            ops, _units = local_ops([pair], gw, TIMEOUTS)
            ops.say = lambda line: print(f"  pdctl: {line}", flush=True)
            for p in ops.source.pairs():
                register_pair(ops, p)
            gw.wait_ready(120)
            n["workers"] = requests.get(f"{gw.url}/workers", timeout=10).json()
        with lane.step("endpoints") as n:
            rec.endpoints = {e.mode: record.endpoints(e.url) for e in engines}
            n["version"] = rec.version()
        with lane.step("canary") as n:
            rec.canary = {"pair_canary": timed_canary(pair, 5), "legs": record.pd_legs(pair)}
            n.update(rec.canary["pair_canary"])
        with lane.step("gateway-traffic") as n:
            rec.gateway["traffic"] = gateway_traffic(gw, "tiny-llama")
            n.update({k: v["status"] for k, v in rec.gateway["traffic"].items()})
        with lane.step("status") as n:
            st = collect(ops)
            rec.status = to_json(st)
            n["healthy"] = st.healthy
        with lane.step("bench") as n:
            rec.bench = bench(lane, gw, decode)
            n["levels"] = len(rec.bench["levels"])
        with lane.step("metrics") as n:
            rec.scrape(engines, gw)
            n["families"] = {role: len(f) for role, f in rec.families().items()}
        with lane.step("restart-both") as n:
            restart_both(lane, ops, n)
            rec.timings["restart_both"] = dict(n)
        with lane.step("canary-after-restart") as n:
            n.update(timed_canary(pair, 5))
        with lane.step("status-after-restart") as n:
            st = collect(ops)
            n["healthy"] = st.healthy
            rec.status_after_restart = to_json(st)
        for e in engines:
            with lane.step(f"analyze-{e.mode}") as n:
                rec.analyze[e.mode] = analyze(lane, e)
                n["keys"] = sorted(rec.analyze[e.mode])
    finally:
        # Also on a timeout's SIGTERM: what the engines said so far is the record.
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop(10)
        if gw is not None:
            stop_pid(gw.proc)
        write_record(lane, engines, gw is not None)


def write_record(lane: Lane, engines: list[EngineProc], gateway_started: bool) -> None:
    rec = lane.rec
    rec.timings["startup_s"] = lane.steps.get("start-engines", {}).get("startup_s")
    rec.timings["canary"] = lane.steps.get("canary")
    rec.timings["machine"] = record.machine()
    rec.logs = {e.mode: e.log_text() for e in engines if e.log_path.exists()}
    smg_log = lane.logs / "smg.log"
    rec.logs["gateway"] = smg_log.read_text(errors="replace") if gateway_started else ""
    with lane.step("write-record") as n:
        n["dir"] = str(rec.write(lane.out / "record"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--inventory",
        type=Path,
        default=INVENTORY,
        help="Another deployment to run the lane against (one pair on 127.0.0.1; a sim "
        "profile rehearses the lane without a GPU).",
    )
    ap.add_argument(
        "--rendered",
        type=Path,
        help="`pdctl render -i INVENTORY --format json` output made where ansible-core is "
        "installed, used instead of rendering here.",
    )
    args = ap.parse_args()
    # A timeout's SIGTERM unwinds through run()'s finally: the engines run in their own
    # sessions and would outlive the lane.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lane = Lane(args.out, args.inventory)
    run(lane, args.rendered)
    failed = [k for k, v in lane.steps.items() if not v.get("ok")]
    print(f"lane: done in {time.monotonic() - lane.t0:.0f} s; failed steps: {failed or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
