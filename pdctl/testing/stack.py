"""Local processes for rehearsals, tests and benchmarks: simulated engines and the gateway.

`SimProc` runs `python -m pdctl.sim` and `start_gateway` runs the real SGLang model gateway
(`smg launch --pd-disaggregation`). Processes are stopped by PID (SIGTERM, then SIGKILL),
never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
import requests

from pdctl.bench.stream import STREAM_FIELDS, StreamCheck, sse_payload
from pdctl.render import environment, launch_args
from pdctl.sim.args import resolve
from pdctl.sim.logs import configure
from pdctl.sim.server import SimServer, running
from pdctl.spec import Deployment, Instance

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# Ports handed out lie below Linux's ephemeral range (ip_local_port_range, 32768-60999 by
# default): a port picked there by binding to 0 can be taken as the local port of any outgoing
# connection (a load test opens thousands) before its server binds it. Each pytest-xdist
# worker draws from its own slice, so two workers never pick the same port either.
PORT_BASE, PORT_SLICE, PORT_SLICES = 10000, 1900, 10
_cursor = 0
_CURSOR_LOCK = threading.Lock()


def _slice_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3", or unset outside xdist
    index = int(worker[2:]) + 1 if worker.startswith("gw") else 0
    return PORT_BASE + (index % PORT_SLICES) * PORT_SLICE


# Local engines talk over 127.0.0.1 only. Left to itself UCX opens every interface it lists at
# start-up, and a test host's veth that goes away meanwhile (a module tearing its host down,
# a cut link) stops the engine: "uct_iface_open(tcp/ve-pde2e-down) failed: No such device".
LOCAL_UCX = {"UCX_NET_DEVICES": "lo"}
# Local engines look for SIGTERM's drain every 0.2 s rather than SGLang's 5 s: a suite stops
# some 480 of them. Tests of the drain's timing set PDSIM_DRAIN_CHECK_S themselves.
LOCAL_DRAIN = {"PDSIM_DRAIN_CHECK_S": "0.2"}


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process (a stack asks
    for several before any is listening: a 3-member etcd once got one peer port twice)."""
    global _cursor
    start = _slice_start()
    with _CURSOR_LOCK:
        for _ in range(PORT_SLICE):
            port = start + _cursor % PORT_SLICE
            _cursor += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use: the next one
            return port
    raise RuntimeError(f"no free port in {start}-{start + PORT_SLICE - 1}")


def wait_until(pred: Callable[[], T | None], timeout: float, what: str, step: float = 0.1) -> T:
    """pred()'s first true value, polled every `step` s for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if got := pred():
                return got
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def stop_pid(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _spawn(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env)


def sim_args(
    mode: str, port: int, bootstrap_port: int, *extra: str, address: str = "127.0.0.1"
) -> list[str]:
    """An engine's launch arguments (after `python -m pdctl.sim`) on `address` (a loopback
    one: 127.0.0.2 plays a second host)."""
    return [
        "--model-path",
        "/models/sim",
        "--served-model-name",
        "sim",
        "--host",
        address,
        "--port",
        str(port),
        "--disaggregation-mode",
        mode,
        "--disaggregation-bootstrap-port",
        str(bootstrap_port),
        *extra,
    ]


@dataclass
class SimProc:
    mode: str
    port: int
    bootstrap_port: int
    log_path: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    address: str = "127.0.0.1"  # another loopback address plays another host

    @classmethod
    def create(
        cls,
        mode: str,
        log_dir: Path,
        env: dict[str, str],
        *,
        backend: str = "nixl",
        extra: Sequence[str] = (),
        port: int | None = None,
        bootstrap_port: int | None = None,
        address: str = "127.0.0.1",
    ) -> SimProc:
        port = port or free_port()
        bootstrap_port = bootstrap_port or free_port()
        argv = [
            sys.executable,
            "-m",
            "pdctl.sim",
            *sim_args(mode, port, bootstrap_port, address=address),
            "--disaggregation-transfer-backend",
            backend,
            "--enable-metrics",
            *extra,
        ]
        return cls(
            mode,
            port,
            bootstrap_port,
            log_dir / f"{mode}-{port}.log",
            argv,
            {**LOCAL_UCX, **LOCAL_DRAIN, **os.environ, **env},
            address=address,
        )

    @classmethod
    def rendered(cls, inst: Instance, dep: Deployment, log_dir: Path) -> SimProc:
        """The engine `inst`'s unit runs: the command line and environment pdctl.render gives
        it (numactl aside), so a profile's tuning and sim knobs reach it as they would on a
        host. A sim profile's instance (engine: sim)."""
        return cls(
            inst.role.value,
            inst.port,
            inst.bootstrap_port or 0,  # a decode serves no bootstrap
            log_dir / f"{inst.name}-{inst.port}.log",
            [sys.executable, "-m", "pdctl.sim", *launch_args(inst, dep)],
            {**LOCAL_UCX, **LOCAL_DRAIN, **os.environ, **environment(inst, dep)},
            address=inst.address,
        )

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> SimProc:
        self.proc = _spawn(self.argv, self.log_path, self.env)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> SimProc:
        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.mode} engine exited (code {self.proc.returncode}): "
                    f"{self.log_text()[-2000:]}"
                )
            # /ready: taking work (a flag check, no generate as /health makes)
            return requests.get(f"{self.url}/ready", timeout=2).status_code == 200

        wait_until(healthy, timeout, f"{self.mode} engine on :{self.port}")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Signal the engine by PID and wait for it; its exit code."""
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=30)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (a unit's TimeoutStopSec)."""
        if self.proc is not None:
            stop_pid(self.proc, grace)

    def restart(self) -> SimProc:
        self.stop()
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


CROSS_GROUP_METRIC = "pdsim_cross_group_transfers_total"


def partner_env(*prefills: SimProc) -> dict[str, str]:
    """The knob that tells a decode its pair's prefill, or its group's prefills (cross-group
    accounting)."""
    return {"PDSIM_PAIR_PARTNER": ",".join(f"{p.address}:{p.bootstrap_port}" for p in prefills)}


def cross_group_transfers(decodes: Iterable[SimProc]) -> dict[str, float]:
    """Per running decode (by URL), the KV transfers it took from another pair's prefill.
    The counter dies with the process: read it before a decode stops."""
    out: dict[str, float] = {}
    for sim in decodes:
        if sim.proc is None or sim.proc.poll() is not None:
            continue
        text = requests.get(f"{sim.url}/metrics", timeout=5).text
        values = [
            float(x.split()[-1]) for x in text.splitlines() if x.startswith(CROSS_GROUP_METRIC)
        ]
        if not values:
            raise RuntimeError(
                f"{sim.url} exposes no {CROSS_GROUP_METRIC}: PDSIM_PAIR_PARTNER unset"
            )
        out[sim.url] = sum(values)
    return out


@dataclass
class Gateway:
    port: int
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_listening(self, timeout: float = 30.0) -> bool:
        """Whether smg opened its port (False when it exited first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return True
            time.sleep(0.05)
        return False

    def wait_ready(self, timeout: float = 60.0) -> Gateway:
        wait_until(
            lambda: requests.get(f"{self.url}/readiness", timeout=2).status_code == 200,
            timeout,
            "gateway readiness",
        )
        return self

    def stop(self) -> None:
        stop_pid(self.proc)


def smg_binary() -> str | None:
    for candidate in (REPO / ".venv/bin/smg", Path(sys.executable).parent / "smg"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("smg")


def start_gateway(
    binary: str, prefills: Sequence[SimProc], decodes: Sequence[SimProc], log_dir: Path, *extra: str
) -> Gateway:
    """`smg launch --pd-disaggregation` with fast worker discovery and health checks.

    A port picked free can be taken by someone else before smg binds it; then smg exits
    and is started again on fresh ports."""
    workers: list[str] = []
    for p in prefills:
        workers += ["--prefill", p.url, str(p.bootstrap_port)]
    for d in decodes:
        workers += ["--decode", d.url]
    for _ in range(3):
        port, metrics_port = free_port(), free_port()
        argv = [binary, "launch", "--pd-disaggregation", "--host", "127.0.0.1",
                "--port", str(port), "--prometheus-port", str(metrics_port),
                "--prometheus-host", "127.0.0.1", "--worker-startup-check-interval", "1",
                "--health-check-interval-secs", "1", "--health-success-threshold", "1",
                "--health-failure-threshold", "1", "--shutdown-grace-period-secs", "1",
                "--log-level", "warn", *workers, *extra]  # fmt: skip
        log_path = log_dir / f"smg-{port}.log"
        gw = Gateway(port, metrics_port, log_path, _spawn(argv, log_path, None))
        if gw.wait_listening():
            return gw
        gw.stop()
    raise RuntimeError(f"smg did not start: {log_path.read_text(errors='replace')[-2000:]}")


@dataclass
class PDStack:
    prefill: SimProc
    decode: SimProc
    gateway: Gateway

    @property
    def url(self) -> str:
        return self.gateway.url


@contextlib.asynccontextmanager
async def in_process(
    mode: str, env: Mapping[str, str], *extra: str, bootstrap_port: int | None = None
) -> AsyncIterator[SimServer]:
    """An engine inside the current event loop on a free port, once it is up."""
    cfg = resolve(sim_args(mode, free_port(), bootstrap_port or free_port(), *extra), env)
    async with running(cfg, configure(cfg.args.log_level, "")) as server:
        while server.status != "up":
            await asyncio.sleep(0.01)
        yield server


@dataclass(frozen=True)
class Outcome:
    """One load request: its HTTP status (0: no answer) and why it failed (None: passed)."""

    status: int
    failure: str | None

    @property
    def ok(self) -> bool:
        return self.failure is None


async def pd_generate(
    http: aiohttp.ClientSession,
    prefill_url: str,
    decode_url: str,
    bootstrap_port: int,
    room: int,
    *,
    text: str = "a request through the pair",
    max_new_tokens: int = 2,
    rid: str | None = None,
) -> tuple[tuple[int, str], tuple[int, str]]:
    """Both legs of one PD request at once, as the gateway sends them; the prefill's and the
    decode's (status, body)."""
    body: dict[str, object] = {
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": room,
    }
    if rid is not None:
        body["rid"] = rid

    async def leg(url: str) -> tuple[int, str]:
        async with http.post(f"{url}/generate", json=body) as resp:
            return resp.status, await resp.text()

    prefill, decode = await asyncio.gather(leg(prefill_url), leg(decode_url))
    return prefill, decode


def served_model(url: str, headers: Mapping[str, str] | None = None, timeout: float = 10) -> str:
    """The first model `/v1/models` lists (smg wants `model` in every chat request)."""
    r = requests.get(f"{url}/v1/models", headers=dict(headers or {}), timeout=timeout)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def stream_chat(
    session: requests.Session, url: str, model: str, max_tokens: int, timeout: float
) -> Outcome:
    """One streamed chat completion, judged by pdctl.bench.stream's failure rule."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "load"}],
        "max_tokens": max_tokens,
        **STREAM_FIELDS,
    }
    try:
        with session.post(
            f"{url}/v1/chat/completions", json=body, stream=True, timeout=timeout
        ) as r:
            if r.status_code != 200:
                return Outcome(r.status_code, f"HTTP {r.status_code}: {r.text[:200]}")
            check = StreamCheck(max_tokens)
            try:
                for line in r.iter_lines():
                    payload = sse_payload(line)
                    if payload is not None:
                        check.feed(payload)
            except requests.RequestException as e:  # the stream was cut
                return Outcome(200, f"stream cut after {check.tokens} tokens: {e}")
            return Outcome(200, check.failure())
    except requests.RequestException as e:
        return Outcome(0, f"no answer: {type(e).__name__}: {e}")


def flowed(outcomes: Sized, more: int = 8, timeout: float = 60.0) -> int:
    """Waits until `more` of constant_load's requests beyond those ended so far have ended,
    however loaded the machine (load flows before and after the event a test plants, where a
    fixed sleep may see none); returns the count of ended requests then."""
    start = len(outcomes)
    wait_until(lambda: len(outcomes) >= start + more, timeout, f"{more} more requests to end")
    return len(outcomes)


@contextlib.contextmanager
def constant_load(
    url: str,
    clients: int = 4,
    max_tokens: int = 8,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    model: str | None = None,
) -> Iterator[list[Outcome]]:
    """Closed-loop clients sending streamed chat completions (`ignore_eos`, `max_tokens`)
    until the block ends; yields every request's Outcome as it completes. `model` defaults
    to the first one the server lists."""

    model = model or served_model(url, headers)
    stop = threading.Event()
    outcomes: list[Outcome] = []

    def client() -> None:
        with requests.Session() as s:
            s.headers.update(headers or {})
            while not stop.is_set():
                outcomes.append(stream_chat(s, url, model, max_tokens, timeout))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for t in threads:
            t.join(timeout + 10)
