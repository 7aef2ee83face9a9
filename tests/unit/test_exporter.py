"""pd-exporter against a fake NVML module and fake engines (local HTTP servers): success,
partial failure (one GPU, one engine, one pair failing) and total failure (no NVML, no
topology) — the exporter keeps serving and says what failed."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from pdctl.exporter.canary import Canary
from pdctl.exporter.collector import PdCollector
from pdctl.exporter.gpu import THROTTLE_REASONS, Nvml
from pdctl.exporter.graph_sizes import GraphSizes
from pdctl.exporter.journal import DecodeJournal, Histogram, JournalTarget
from pdctl.exporter.statelog import StateLog
from pdctl.exporter.targets import TopologyFile
from pdctl.testing.nvml import STANDIN_DIR, STATE_ENV, FakeEvent, FakeGpu, FakeNvml, write_state
from pdctl.topology import Topology, dump
from tests.conftest import ROOT, one_pair_topology

HOST = "gpu-node-1"
PAIR = f"{HOST}/pd0"
DECODE = f"{HOST}/pd0-decode"


# ----- fake engines ------------------------------------------------------------------------
@dataclass
class EngineBehaviour:
    generate_status: int = 200
    server_info_status: int = 200
    graph_buckets: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    bodies: list[dict[str, Any]] = field(default_factory=list)


def serve(behaviour: EngineBehaviour) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            behaviour.bodies.append(json.loads(self.rfile.read(length)))
            ok = behaviour.generate_status == 200
            self._send(behaviour.generate_status, {"text": "pong"} if ok else {"error": "x"})

        def do_GET(self) -> None:
            self._send(
                behaviour.server_info_status, {"cuda_graph_bs_decode": behaviour.graph_buckets}
            )

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def topology(prefill_url: str, decode_url: str) -> Topology:
    return one_pair_topology(
        HOST,
        prefill_url,
        decode_url,
        bootstrap_port=8998,
        gateway_url="http://127.0.0.1:8000",
        metrics_url="http://127.0.0.1:29000/metrics",
    )


DECODE_LINE = (
    "[2026-11-29 10:00:00] Decode batch, #running-req: {running}, #token: 9000, token usage: 0.05, "
    "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, "
    "cuda graph: {graph}, gen throughput (token/s): {tput}, #queue-req: 0\n"
)


@dataclass
class Rig:
    registry: CollectorRegistry
    collector: PdCollector
    canary: Canary
    prefill: EngineBehaviour
    decode: EngineBehaviour
    journal: Path

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def scrape_until(self, name: str, labels: dict[str, str], expected: float) -> None:
        deadline = time.monotonic() + 5
        while self.value(name, **labels) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.value(name, **labels) == expected, (name, labels)


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    options: dict[str, Any] = getattr(request, "param", {})
    prefill, decode = EngineBehaviour(), EngineBehaviour()
    servers = [serve(prefill), serve(decode)]
    topo_path = tmp_path / "topology.yaml"
    if options.get("topology", True):
        topo_path.write_text(dump(topology(servers[0][1], servers[1][1])))
    journal = tmp_path / "decode.log"
    journal.write_text(
        DECODE_LINE.format(running=40, graph="True", tput="800.00")
        + "some other line\n"
        + DECODE_LINE.format(running=70, graph="False", tput="700.00")
    )
    log = StateLog()
    nvml_module = options.get("nvml", FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b", throttle=0x44)]))
    nvml = Nvml(nvml_module, log)
    canary = Canary(interval_s=60, timeout_s=2, log=log)
    collector = PdCollector(
        TopologyFile(topo_path),
        HOST,
        nvml,
        canary,
        GraphSizes(timeout_s=2),
        {"pd0-decode": journal},
        log,
    )
    collector.refresh()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    yield Rig(registry, collector, canary, prefill, decode, journal)
    collector.stop()
    nvml.stop()
    for server, _ in servers:
        server.shutdown()


def test_success_serves_every_source(rig: Rig) -> None:
    rig.canary.run_once()
    rig.scrape_until(
        "pdstack_decode_batches_total", {"engine": DECODE, "pair": PAIR, "mode": "eager"}, 1
    )
    assert rig.value("pdstack_up") == 1
    for collector in ("topology", "gpu", "canary", "decode"):
        assert rig.value("pdstack_scrape_success", collector=collector) == 1, collector
        assert rig.value("pdstack_scrape_duration_seconds", collector=collector) is not None
    assert rig.value("pdstack_gpu_up") == 1
    for role in ("prefill", "decode"):  # the topology's members (a pair: one a role)
        assert rig.value("pdstack_group_members", pair=PAIR, role=role) == 1
    gpu1 = {
        "gpu": "1",
        "uuid": "GPU-b",
        "role": "decode",
        "numa_node": "1",
        "engine": DECODE,
        "pair": PAIR,
    }
    assert rig.value("pdstack_gpu_power_watts", **gpu1) == 342
    assert rig.value("pdstack_gpu_sm_utilization_ratio", **gpu1) == 0.97
    assert rig.value("pdstack_gpu_memory_utilization_ratio", **gpu1) == 0.27
    assert rig.value("pdstack_gpu_memory_total_bytes", **gpu1) == 96 << 30
    assert rig.value("pdstack_gpu_clock_hertz", **gpu1, clock="sm") == 2.4e9
    assert (
        rig.value("pdstack_gpu_pcie_throughput_bytes_per_second", **gpu1, direction="rx") == 2048000
    )
    assert rig.value("pdstack_gpu_throttle_reason", **gpu1, reason="sw_power_cap") == 1
    assert rig.value("pdstack_gpu_throttle_reason", **gpu1, reason="hw_thermal_slowdown") == 1
    assert rig.value("pdstack_gpu_throttle_reason", **gpu1, reason="hw_slowdown") == 0
    assert (
        rig.value(
            "pdstack_gpu_temperature_celsius",
            gpu="0",
            uuid="GPU-a",
            role="prefill",
            numa_node="0",
            engine=f"{HOST}/pd0-prefill",
            pair=PAIR,
        )
        == 71
    )
    # canary: one body to both sides, with the prefill's bootstrap address and a shared room
    assert rig.value("pdstack_pair_canary_success", pair=PAIR) == 1
    assert rig.value("pdstack_pair_canary_runs_total", pair=PAIR) == 1
    assert rig.value("pdstack_pair_canary_failures_total", pair=PAIR) == 0
    (sent_p,), (sent_d,) = rig.prefill.bodies, rig.decode.bodies
    assert sent_p == sent_d and sent_p["bootstrap_port"] == 8998
    assert (
        sent_p["bootstrap_host"] == "127.0.0.1" and sent_p["sampling_params"]["max_new_tokens"] == 1
    )
    # journal: one graph and one eager batch; running 40 and 70; steps 50 ms and 100 ms
    key = {"engine": DECODE, "pair": PAIR}
    assert rig.value("pdstack_decode_batches_total", **key, mode="graph") == 1
    assert rig.value("pdstack_decode_running_requests_bucket", **key, le="48.0") == 1
    assert rig.value("pdstack_decode_running_requests_count", **key) == 2
    assert rig.value("pdstack_decode_step_seconds_sum", **key) == pytest.approx(0.15)
    assert rig.value("pdstack_decode_cuda_graph_max_batch_size", **key) == 64


def test_journal_is_followed_as_it_grows(rig: Rig) -> None:
    key = {"engine": DECODE, "pair": PAIR, "mode": "eager"}
    rig.scrape_until("pdstack_decode_batches_total", key, 1)
    with rig.journal.open("a") as f:
        f.write(DECODE_LINE.format(running=90, graph="False", tput="600.00"))
    rig.scrape_until("pdstack_decode_batches_total", key, 2)


# Every prefix rank sglang 0.5.23 can print, PD host receive and speculative decoding.
SPEC_LINE = (
    "[2026-11-29 10:00:05.120 DP1 PP0 ATTN_CP1 MOE_DP1 TP4 EP4] Decode batch, #running-req: 50, "
    "#token: 9000, token usage: 0.05, accept len: 2.50, accept rate: 0.50, "
    "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #host-receive-req: 3, "
    "#retracted-req: 0, cuda graph: True, gen throughput (token/s): 1250.00, #queue-req: 0\n"
)


def test_journal_reads_rank_prefixes_and_speculative_steps(rig: Rig) -> None:
    key = {"engine": DECODE, "pair": PAIR}
    rig.scrape_until("pdstack_decode_batches_total", {**key, "mode": "eager"}, 1)
    with rig.journal.open("a") as f:
        f.write(SPEC_LINE)
    rig.scrape_until("pdstack_decode_batches_total", {**key, "mode": "graph"}, 2)
    # 50 requests x 2.5 tokens per step at 1250 tok/s: a step takes 0.1 s (not 0.04 s)
    assert rig.value("pdstack_decode_step_seconds_sum", **key) == pytest.approx(0.05 + 0.1 + 0.1)
    assert rig.value("pdstack_decode_step_seconds_bucket", **key, le="0.075") == 1
    assert rig.value("pdstack_decode_step_seconds_bucket", **key, le="0.1") == 3


def test_xid_events_are_counted_per_gpu_and_code(tmp_path: Path) -> None:
    fake = FakeNvml(
        [FakeGpu("GPU-a"), FakeGpu("GPU-b")],
        xids=[FakeEvent(1, 79), FakeEvent(1, 79), FakeEvent(0, 13)],
    )
    nvml = Nvml(fake, StateLog())
    assert nvml.init()
    deadline = time.monotonic() + 5
    while sum(nvml.xids().values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    nvml.stop()
    assert nvml.xids() == {(1, 79): 2, (0, 13): 1}


def test_standin_pynvml_rereads_the_planted_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in a separate exporter imports as pynvml: changes planted while it runs are
    read, and each planted XID event is delivered once."""
    spec = importlib.util.spec_from_file_location("pynvml", STANDIN_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    state = tmp_path / "nvml.json"
    monkeypatch.setenv(STATE_ENV, str(state))
    fake = FakeNvml([FakeGpu("GPU-a", temperature_c=50)], xids=[FakeEvent(0, 79)])
    write_state(state, fake)
    nvml = Nvml(standin, StateLog())
    try:
        assert nvml.init()
        assert nvml.read()[0][0].values["temperature_celsius"] == 50
        fake.gpus[0].temperature_c = 80
        fake.xids.append(FakeEvent(0, 79))
        write_state(state, fake)
        assert nvml.read()[0][0].values["temperature_celsius"] == 80
        deadline = time.monotonic() + 5
        while nvml.xids() != {(0, 79): 2} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nvml.xids() == {(0, 79): 2}
    finally:
        nvml.stop()


@pytest.mark.parametrize(
    "rig",
    [{"nvml": FakeNvml([FakeGpu("GPU-a", pcie_supported=False), FakeGpu("GPU-b", broken=True)])}],
    indirect=True,
)
def test_partial_failure_reports_what_failed_and_serves_the_rest(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.decode.generate_status = 500
    rig.decode.server_info_status = 503
    caplog.set_level(logging.WARNING, logger="pdctl.exporter")
    rig.canary.run_once()
    assert rig.value("pdstack_up") == 0
    assert rig.value("pdstack_scrape_success", collector="gpu") == 0
    assert rig.value("pdstack_scrape_success", collector="decode") == 0
    assert rig.value("pdstack_scrape_success", collector="topology") == 1
    # The readable GPU is still served; its unsupported PCIe reading is left out.
    gpu0 = {
        "gpu": "0",
        "uuid": "GPU-a",
        "role": "prefill",
        "numa_node": "0",
        "engine": f"{HOST}/pd0-prefill",
        "pair": PAIR,
    }
    assert rig.value("pdstack_gpu_power_watts", **gpu0) == 342
    assert rig.value("pdstack_gpu_pcie_throughput_bytes_per_second", **gpu0, direction="tx") is None
    assert (
        rig.value(
            "pdstack_gpu_power_watts",
            gpu="1",
            uuid="GPU-b",
            role="decode",
            numa_node="1",
            engine=DECODE,
            pair=PAIR,
        )
        is None
    )
    # A failing pair is the canary's finding, not the canary's failure.
    assert rig.value("pdstack_pair_canary_success", pair=PAIR) == 0
    assert rig.value("pdstack_pair_canary_failures_total", pair=PAIR) == 1
    assert rig.value("pdstack_scrape_success", collector="canary") == 1
    assert rig.value("pdstack_decode_cuda_graph_max_batch_size", engine=DECODE, pair=PAIR) is None
    assert (rig.value("pdstack_scrape_errors_total", collector="gpu") or 0) >= 1
    # One line per failing source, not one per scrape.
    for _ in range(3):
        rig.value("pdstack_up")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU 1" in m for m in messages) == 1
    assert (
        sum(m.startswith("canary gpu-node-1/pd0: decode answered HTTP 500") for m in messages) == 1
    )
    # ...but one per failed canary: the journal holds what the failures counter counts.
    rig.canary.run_once()
    assert rig.value("pdstack_pair_canary_failures_total", pair=PAIR) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("canary gpu-node-1/pd0: ") for m in messages) == 2
    assert sum("GPU 1" in m for m in messages) == 1


@pytest.mark.parametrize(
    "rig", [{"topology": False, "nvml": FakeNvml([], init_error=12)}], indirect=True
)
def test_total_failure_keeps_serving(rig: Rig, tmp_path: Path) -> None:
    assert rig.value("pdstack_up") == 0
    assert rig.value("pdstack_gpu_up") == 0
    assert rig.value("pdstack_scrape_success", collector="topology") == 0
    # No NVML is a state of the host (pdstack_gpu_up), not a failing collector.
    assert rig.value("pdstack_scrape_success", collector="gpu") == 1
    rig.canary.run_once()
    assert rig.value("pdstack_pair_canary_success", pair=PAIR) is None
    # A malformed file is reported the same way; a later good file is picked up.
    path = tmp_path / "topology.yaml"
    path.write_text("version: 1\ninstances: [")
    assert rig.value("pdstack_scrape_success", collector="topology") == 0
    path.write_text(dump(topology("http://127.0.0.1:9", "http://127.0.0.1:9")))
    assert rig.value("pdstack_scrape_success", collector="topology") == 1


def test_no_nvml_library_at_all() -> None:
    nvml = Nvml(None, StateLog())
    assert not nvml.init()


def test_throttle_bits_match_nvml_constants() -> None:
    pynvml = pytest.importorskip("pynvml")
    assert THROTTLE_REASONS["hw_slowdown"] == pynvml.nvmlClocksThrottleReasonHwSlowdown
    assert (
        THROTTLE_REASONS["hw_thermal_slowdown"] == pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    )
    assert THROTTLE_REASONS["sw_power_cap"] == pynvml.nvmlClocksThrottleReasonSwPowerCap


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((1.0, 8.0))
    for v in (1, 1, 5, 100):
        h.observe(v)
    assert h.cumulative() == [("1.0", 2), ("8.0", 3), ("+Inf", 4)]
    assert h.total == 107


FAKE_JOURNALCTL = """#!/bin/sh
# Fake journalctl: the first read (-n 0) gives a cursor; later reads after it give two batches.
echo "$@" >> "$(dirname "$0")/calls"
case "$*" in
  *"--after-cursor c1"*) printf '%s\\n%s\\n-- cursor: c2\\n' "$LINE1" "$LINE2" ;;
  *"--after-cursor c2"*) echo "-- cursor: c2" ;;
  *"-n 0"*) echo "-- cursor: c1" ;;
  *) exit 1 ;;
esac
"""


def test_journal_is_polled_with_a_cursor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text(FAKE_JOURNALCTL)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LINE1", DECODE_LINE.format(running=10, graph="True", tput="500.00").strip())
    monkeypatch.setenv("LINE2", DECODE_LINE.format(running=99, graph="False", tput="90.00").strip())
    target = JournalTarget(DECODE, PAIR, "pdstack-pd0-decode.service")
    journal = DecodeJournal(target, StateLog(), poll_s=0.05).start()
    try:
        deadline = time.monotonic() + 5
        while sum(journal.stats().batches.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # later polls add nothing: the cursor moved on
        assert journal.stats().batches == {"graph": 1, "eager": 1}
        assert journal.error is None
    finally:
        journal.stop()
    calls = (bin_dir / "calls").read_text().splitlines()
    assert "-n 0" in calls[0] and "-u pdstack-pd0-decode.service" in calls[0]


# ----- the command's bad input: one line, exit 2, nothing started ---------------------------
def _exporter(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pdctl.exporter` as systemd runs it (no topology: it would serve regardless)."""
    return subprocess.run(
        [sys.executable, "-m", "pdctl.exporter", "--topology", "/nonexistent.yaml", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_exporter_port_out_of_range() -> None:
    r = _exporter("--port", "70000")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Invalid value for '--port': 70000 is not in the range 1<=x<=65535" in r.stderr


def test_exporter_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _exporter("--port", str(port))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()  # bound before anything else runs or logs
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "choose --port" in line


def test_exporter_listen_address_not_on_this_host() -> None:
    r = _exporter("--listen-address", "192.0.2.1", "--port", "19840")  # TEST-NET-1: not ours
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("Error: cannot listen on 192.0.2.1:19840: Cannot assign requested")
    assert "not an address of this host" in line
