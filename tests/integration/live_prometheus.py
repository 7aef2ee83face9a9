"""A real Prometheus (Debian's) for live monitoring tests: configured from the Prometheus
role's own templates and rules, with helpers to read what a dashboard panel shows."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from monitoring.config import load
from monitoring.dashboards.export import expressions, render_dashboards
from monitoring.rules import render_rules
from pdctl.testing.stack import (
    Gateway,
    SimProc,
    free_port,
    smg_binary,
    start_gateway,
    stop_pid,
    wait_until,
)
from pdctl.topology import Topology, dump
from tests import prometheus_role
from tests.conftest import ROOT, one_pair_topology, require_tool
from tests.integration.conftest import FAST_SIM_ENV
from tests.promql import substitute

HOST = "testhost"  # the inventory name the live modules give 127.0.0.1
SCRAPE_S = 1  # every target's scrape (and rule evaluation) interval
GPU_ONLY = "needs NVML: the test host has no GPU (pdstack_gpu_up is 0)"
# The panels of pdstack-gpus that read NVML.
GPU_PANELS = (
    "SM utilisation",
    "Memory-controller utilisation",
    "Power vs limit",
    "Power",
    "GPU memory used",
    "Temperature",
    "SM clock",
    "PCIe throughput",
    "Throttle reasons",
    "XID errors",
)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        r = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        body = r.json()
        assert body["status"] == "success", (expr, body)
        return list(body["data"]["result"])

    def has_series(self, name: str) -> bool:
        r = requests.get(
            f"{self.url}/api/v1/series", params={"match[]": f'{{__name__="{name}"}}'}, timeout=10
        )
        return bool(r.json()["data"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(requests.get(f"{self.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"])

    def firing(self, name: str, **labels: str) -> bool:
        return any(
            a["labels"]["alertname"] == name
            and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())
            for a in self.alerts()
        )

    def wait_scrapes(self, count: int = 2, timeout: float = 60) -> None:
        """Until every target has been scraped `count` times since this call (each scrape's
        sample is stamped with the scrape's start): what the targets showed before the call is
        stored, however slowly a loaded machine scrapes, instead of a window of seconds."""
        for _ in range(count):
            since = time.time()

            def scraped(since: float = since) -> bool:
                return float(self.query("min(timestamp(up))")[0]["value"][1]) > since

            wait_until(scraped, timeout, "a scrape of every target", step=0.2)

    def wait_window(self, start: float, seconds: float) -> float:
        """Until `seconds` after `start` and two more scrapes of every target: a window for
        rate() whose edges hold what happened in it. Returns the window's end."""
        time.sleep(max(0.0, start + seconds - time.time()))
        self.wait_scrapes(2)
        return time.time()

    def by_label(self, expr: str, at: float, label: str = "engine") -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr, at)}


def start_process(
    argv: list[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def start_exporter(
    topo_file: Path,
    host: str,
    port: int,
    journal: Path,
    log: Path,
    *options: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """pd-exporter as its unit runs it, reading pd0's decode journal from a file."""
    argv = [sys.executable, "-m", "pdctl.exporter", "--topology", str(topo_file)]
    argv += ["--host", host, "--port", str(port), "--journal-file", f"pd0-decode={journal}"]
    return start_process([*argv, *options], log, env)


def stack_topology(
    prefill: SimProc, decode: SimProc, gateway: Gateway, **gpus: tuple[int, ...]
) -> Topology:
    """The topology of one local sim pair behind a local gateway (gpus: prefill_gpus=,
    decode_gpus=)."""
    return one_pair_topology(
        HOST,
        prefill.url,
        decode.url,
        bootstrap_port=prefill.bootstrap_port,
        gateway_url=gateway.url,
        metrics_url=f"http://127.0.0.1:{gateway.metrics_port}/metrics",
        **gpus,
    )


def render_prometheus_config(
    root: Path, topo: Topology, host: str, ports: dict[str, int], rule_overrides: dict[str, object]
) -> Path:
    """The role's config for one host at 127.0.0.1 (ports: exporter, node), scraped and
    evaluated every second."""
    hostvars = {host: {"ansible_host": "127.0.0.1"}}
    rules = render_rules(load({"thresholds": rule_overrides}))
    return prometheus_role.render_prometheus_config(
        root, topo, hostvars, ports, rules, f"{SCRAPE_S}s", f"{SCRAPE_S}s"
    )


@contextmanager
def running_prometheus(config: Path, tmp_path: Path, targets_up: int) -> Iterator[Prometheus]:
    """Prometheus on a free port with the config promtool accepted, once `targets_up`
    targets are up; stopped by PID."""
    promtool, prometheus = require_tool("promtool"), require_tool("prometheus")
    subprocess.run([str(promtool), "check", "config", str(config)], check=True)
    port = free_port()
    proc = start_process(
        [
            str(prometheus),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{url}/-/ready", timeout=2).ok, 30, "prometheus")
        prom = Prometheus(url, proc)
        wait_until(
            lambda: len([r for r in prom.query("up") if r["value"][1] == "1"]) >= targets_up,
            30,
            f"{targets_up} targets up",
        )
        yield prom
    finally:
        stop_pid(proc)


def panel_exprs(uid: str, title: str, metric: str = "") -> list[str]:
    """The expressions of one dashboard panel that read `metric` (all of them by default)."""
    board = next(b for b in map(json.loads, render_dashboards().values()) if b["uid"] == uid)
    found = [e for t, e in expressions(board) if t == title and metric in e]
    assert found, (uid, title, metric)
    return found


def panel_counts(
    prom: Prometheus, expr: str, start: float, end: float, label: str = "engine"
) -> tuple[dict[str, float], float]:
    """A rate panel's count per `label` over [start - 2 s, end], and the relative tolerance.
    The window opens two scrapes before `start` so that it holds a sample from before the
    first planted event (they can all land within one scrape); `start` must be two scrapes
    after any earlier event. rate() x window is the count, extrapolated to the window's
    edges: Prometheus' extrapolatedRate (promql/functions.go) extends an edge all the way
    when its gap is under 1.1 average scrape intervals, so by up to 1.1 intervals a side
    (a CI run extrapolated 2.003 s over both edges, past one interval a side)."""
    window = math.ceil(end - start) + 2
    rate = prom.by_label(substitute(expr, f"{window}s"), end, label)
    edges = 2 * 1.1 * SCRAPE_S
    return {e: v * window for e, v in rate.items()}, edges / (window - edges)


# A decode restarted alone fails every KV transfer (docs/sim.md, degraded pair) until the pair
# is restarted together.
DEGRADED_ENV = {"PDSIM_DEGRADED": "on", "PDSIM_DEGRADED_FAIL_RATIO": "1"}


@dataclass
class MonitoredPair:
    """One sim pair behind the real gateway, pd-exporter (pair canary every second) and node
    exporter, scraped every second by a real Prometheus."""

    prom: Prometheus
    gateway: Gateway
    prefill: SimProc
    decode: SimProc

    def canary(self) -> float | None:
        """The pair canary's last result as Prometheus has it (None before the first)."""
        found = self.prom.query(f'pdstack_pair_canary_success{{pair="{HOST}/pd0"}}')
        return float(found[0]["value"][1]) if found else None

    def restart_decode_alone(self, timeout: float = 40) -> None:
        """The production incident: the decode restarted without its prefill; returns once
        Prometheus has the pair canary failing."""
        self.decode.restart().wait_healthy()
        wait_until(lambda: self.canary() == 0, timeout, "the pair canary failing")

    def restart_both(self, timeout: float = 40) -> None:
        """What `pdctl restart --both` does to the engines (both stop, then both start);
        returns once Prometheus has the pair canary passing again."""
        self.decode.stop()
        self.prefill.stop()
        self.prefill.start()
        self.decode.start()
        self.prefill.wait_healthy()
        self.decode.wait_healthy()
        wait_until(lambda: self.canary() == 1, timeout, "the pair canary passing")


@contextmanager
def monitored_pair(
    root: Path,
    rule_overrides: dict[str, object],
    prefill_extra: Sequence[str] = (),
    decode_extra: Sequence[str] = (),
) -> Iterator[MonitoredPair]:
    """The stack of the live monitoring modules, outside pytest's fixtures (the dashboard
    previews drive it from a script too); every process stopped by PID on the way out."""
    binary, node_exporter = smg_binary(), require_tool("prometheus-node-exporter")
    if binary is None:
        raise RuntimeError("smg (the SGLang model gateway) is not installed; run scripts/setup.sh")
    env = {**FAST_SIM_ENV, **DEGRADED_ENV}
    with ExitStack() as stack:
        engines = []
        for mode, extra in (("prefill", prefill_extra), ("decode", decode_extra)):
            sim = SimProc.create(mode, root, env, extra=extra)
            stack.callback(sim.stop)
            engines.append(sim.start())
        prefill, decode = (sim.wait_healthy() for sim in engines)
        gateway = start_gateway(binary, [prefill], [decode], root)
        stack.callback(gateway.stop)
        gateway.wait_ready()
        topo = stack_topology(prefill, decode, gateway, prefill_gpus=(0, 1), decode_gpus=(2, 3))
        topo_file = root / "topology.yaml"
        topo_file.write_text(dump(topo))
        ports = {"exporter": free_port(), "node": free_port()}
        canary = ("--canary-interval", "1", "--canary-timeout", "3")
        for proc in (
            start_exporter(topo_file, HOST, ports["exporter"], decode.log_path,
                           root / "exporter.log", *canary),
            start_process([str(node_exporter), f"--web.listen-address=127.0.0.1:{ports['node']}"],
                          root / "node.log"),
        ):  # fmt: skip
            stack.callback(stop_pid, proc)
        config = render_prometheus_config(root / "prom", topo, HOST, ports, rule_overrides)
        prom = stack.enter_context(running_prometheus(config, root, targets_up=5))
        yield MonitoredPair(prom, gateway, prefill, decode)
