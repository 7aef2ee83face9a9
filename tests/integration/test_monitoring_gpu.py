"""The GPUs dashboard and the GPU alerts against planted GPU readings. The test host has no
GPU, so pd-exporter runs with the stand-in NVML (pdctl/testing/nvml.py: the pynvml surface it
uses, serving a state file the test rewrites while it runs) for one TP4 pair on one host:
GPUs 0-3 the prefill's on NUMA node 0, GPUs 4-7 the decode's on NUMA node 1. A real
Prometheus configured from the role's templates scrapes it. No engine runs: the exporter fails
its decode collector and still serves the GPU families.

Every panel of pdstack-gpus must show each GPU's planted value with its role and NUMA labels,
the template variables must offer the planted roles and NUMA nodes, planted throttle bits must
show as their named reasons and N planted XID events as N. A healthy plant keeps the GPU
alerts silent; planted slowdowns, XIDs and a lost driver fire them."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.config import load
from monitoring.dashboards.export import expressions, render_dashboards
from monitoring.rules import render_rules
from pdctl.exporter.gpu import THROTTLE_REASONS
from pdctl.testing.nvml import (
    GIB,
    STANDIN_DIR,
    STATE_ENV,
    FakeEvent,
    FakeGpu,
    FakeNvml,
    write_state,
)
from pdctl.testing.stack import free_port, stop_pid, wait_until
from pdctl.topology import dump
from tests.conftest import ROOT, one_pair_topology
from tests.integration.live_prometheus import (
    HOST,
    Prometheus,
    panel_exprs,
    render_prometheus_config,
    running_prometheus,
    start_exporter,
)
from tests.promql import substitute

UID = "pdstack-gpus"
PREFILL_GPUS, DECODE_GPUS = (0, 1, 2, 3), (4, 5, 6, 7)
# The XID panel counts the events of its window; a window longer than the test's phase keeps
# every planted event inside it.
RATE_INTERVAL = "2m"
RULE_OVERRIDES: dict[str, object] = {"throttle_for": "2s", "xid_for": "2s", "down_for": "2s"}
GPU_ALERTS = ("PDGPUThrottling", "PDGPUXidErrors", "PDGPUTelemetryMissing")
DRIVER_NOT_LOADED = 9  # NVML_ERROR_DRIVER_NOT_LOADED

# Per-GPU panels: title -> the value each GPU must show, from its planted readings.
READINGS: dict[str, Callable[[FakeGpu], float]] = {
    "SM utilisation": lambda g: g.util_gpu / 100,
    "Memory-controller utilisation": lambda g: g.util_memory / 100,
    "Power vs limit": lambda g: g.power_mw / g.power_limit_mw,
    "Power": lambda g: g.power_mw / 1000,
    "GPU memory used": lambda g: g.memory_used / g.memory_total,
    "Temperature": lambda g: g.temperature_c,
    "SM clock": lambda g: g.sm_clock_mhz * 1e6,
    "PCIe throughput": lambda g: (g.pcie_tx_kbps + g.pcie_rx_kbps) * 1024,  # both directions
}
# Checked below one by one: NVML available, Throttle reasons, XID errors.
EVENT_PANELS = {"NVML available", "Throttle reasons", "XID errors"}
# The node exporter's readings of the host itself, nothing a test can plant (test_monitoring_live
# checks that they have data).
HOST_PANELS = {"CPU busy", "Host memory used", "Network"}


def gpu(index: int) -> FakeGpu:
    """Readings that differ on every GPU, so a GPU shown under another's labels is caught.
    Prefill GPUs idle (gpu_idle), decode GPUs at their power cap: both normal, no alert."""
    decode = index in DECODE_GPUS
    return FakeGpu(
        f"GPU-{index:08x}-test",
        memory_used=(20 + 5 * index) * GIB,
        memory_total=80 * GIB,
        power_mw=(150 + 40 * index) * 1000,
        power_limit_mw=700_000,
        util_gpu=40 + 7 * index,
        util_memory=10 + 3 * index,
        temperature_c=45 + 4 * index,
        sm_clock_mhz=1400 + 50 * index,
        pcie_tx_kbps=1000 * (index + 1),
        pcie_rx_kbps=300 * (index + 1),
        throttle=THROTTLE_REASONS["sw_power_cap"] if decode else THROTTLE_REASONS["gpu_idle"],
    )


def owner(index: int) -> dict[str, str]:
    role, numa = ("prefill", "0") if index in PREFILL_GPUS else ("decode", "1")
    return {"role": role, "numa_node": numa, "engine": f"{HOST}/pd0-{role}", "pair": f"{HOST}/pd0"}


@dataclass
class GpuStack:
    prom: Prometheus
    state: Path
    healthy: FakeNvml

    def plant(self, nvml: FakeNvml) -> None:
        write_state(self.state, nvml)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[GpuStack]:
    healthy = FakeNvml([gpu(i) for i in (*PREFILL_GPUS, *DECODE_GPUS)])
    state = tmp_path / "nvml.json"
    write_state(state, healthy)

    def nobody() -> str:
        return f"http://127.0.0.1:{free_port()}"

    topo = one_pair_topology(
        HOST,
        nobody(),
        nobody(),
        bootstrap_port=free_port(),
        gateway_url=nobody(),
        metrics_url=f"{nobody()}/metrics",
        prefill_gpus=PREFILL_GPUS,
        decode_gpus=DECODE_GPUS,
    )
    topo_file, journal = tmp_path / "topology.yaml", tmp_path / "decode.log"
    topo_file.write_text(dump(topo))
    journal.touch()
    ports = {"exporter": free_port(), "node": free_port()}  # no node exporter: not GPU panels
    exporter = start_exporter(
        topo_file,
        HOST,
        ports["exporter"],
        journal,
        tmp_path / "exporter.log",
        "--canary-interval",
        "60",
        env={**os.environ, "PYTHONPATH": f"{STANDIN_DIR}:{ROOT}", STATE_ENV: str(state)},
    )
    try:
        config = render_prometheus_config(tmp_path / "prom", topo, HOST, ports, RULE_OVERRIDES)
        with running_prometheus(config, tmp_path, targets_up=1) as prom:
            yield GpuStack(prom, state, healthy)
    finally:
        stop_pid(exporter)


def gpu_rules() -> dict[str, str]:
    return {
        r["alert"]: r["expr"]
        for g in yaml.safe_load(render_rules(load({"thresholds": RULE_OVERRIDES})))["groups"]
        for r in g["rules"]
        if r.get("alert") in GPU_ALERTS
    }


def board() -> dict[str, Any]:
    return next(b for b in map(json.loads, render_dashboards().values()) if b["uid"] == UID)


def shown(prom: Prometheus, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
    return [
        (r["metric"], float(r["value"][1])) for r in prom.query(substitute(expr, RATE_INTERVAL), at)
    ]


def assert_labels(labels: dict[str, str], index: int) -> None:
    """The panel's labels of GPU `index` are its owner's (engine and pair where kept)."""
    want = {"host": HOST, **owner(index)}
    assert {k: v for k, v in labels.items() if k in want} == {
        k: v for k, v in want.items() if k in labels
    }, (index, labels)
    assert {"host", "role", "numa_node"} <= labels.keys(), labels


def test_gpu_panels_show_planted_values_and_gpu_alerts_fire(stack: GpuStack) -> None:
    prom = stack.prom
    wait_until(lambda: len(prom.query("pdstack_gpu_temperature_celsius")) == 8, 30, "8 GPUs")
    # No engine runs: the exporter says so and still serves every GPU family.
    assert prom.by_label("pdstack_scrape_success", time.time(), "collector") == {
        "topology": 1,
        "gpu": 1,
        "canary": 1,
        "decode": 0,
    }

    titles = {t for t, _ in expressions(board())}
    assert titles == set(READINGS) | EVENT_PANELS | HOST_PANELS, "a panel this test does not read"
    at = time.time()
    planted = {i: g for i, g in enumerate(stack.healthy.gpus)}
    report = {}
    for title, reading in READINGS.items():
        (expr,) = panel_exprs(UID, title)
        values = {}
        for labels, value in shown(prom, expr, at):
            index = int(labels["gpu"])
            assert_labels(labels, index)
            values[index] = value
        assert values == pytest.approx({i: reading(g) for i, g in planted.items()}), title
        report[title] = values
    print("planted vs shown:", json.dumps(report, indent=1))
    assert_variables(prom, at)
    (nvml,) = panel_exprs(UID, "NVML available")
    assert [v for _, v in shown(prom, nvml, at)] == [1]
    assert throttle_shown(prom, at) == {
        (i, "gpu_idle" if i in PREFILL_GPUS else "sw_power_cap") for i in planted
    }
    (xid_expr,) = panel_exprs(UID, "XID errors")
    assert shown(prom, xid_expr, at) == []
    # Healthy: no GPU alert's expression has data (so none can fire).
    for alert, expr in gpu_rules().items():
        assert prom.query(expr) == [], alert

    # Heat and a hardware slowdown on two GPUs, a lone XID 13 and three XID 79s.
    sick = replace(
        stack.healthy,
        gpus=[
            replace(g, throttle=g.throttle | THROTTLE_REASONS[reason])
            if (reason := {2: "hw_slowdown", 5: "hw_thermal_slowdown"}.get(i))
            else g
            for i, g in enumerate(stack.healthy.gpus)
        ],
        xids=[FakeEvent(1, 13), *[FakeEvent(6, 79)] * 3],
    )
    stack.plant(sick)
    wait_until(
        lambda: prom.by_label("sum(pdstack_gpu_xid_errors_total)", time.time()) == {"": 4},
        30,
        "the planted XIDs scraped",
    )
    wait_until(lambda: (2, "hw_slowdown") in throttle_shown(prom), 30, "planted throttling")
    at = time.time()
    xids = {}
    for labels, value in shown(prom, xid_expr, at):
        assert_labels(labels, int(labels["gpu"]))
        xids[(int(labels["gpu"]), labels["xid"])] = value
    print("XID panel:", xids)
    assert xids == {(1, "13"): 1, (6, "79"): 3}
    assert throttle_shown(prom, at) == {
        *((i, "gpu_idle" if i in PREFILL_GPUS else "sw_power_cap") for i in planted),
        (2, "hw_slowdown"),
        (5, "hw_thermal_slowdown"),
    }
    # Power capping stays silent; the slowdowns and the XIDs fire, on the right GPU and engine.
    for index, reason in ((2, "hw_slowdown"), (5, "hw_thermal_slowdown")):
        wait_until(
            lambda i=index, r=reason: prom.firing(
                "PDGPUThrottling", gpu=str(i), reason=r, engine=owner(i)["engine"]
            ),
            30,
            f"PDGPUThrottling {reason}",
        )
    for index, xid in ((1, "13"), (6, "79")):
        wait_until(
            lambda i=index, x=xid: prom.firing(
                "PDGPUXidErrors", gpu=str(i), xid=x, engine=owner(i)["engine"]
            ),
            30,
            f"PDGPUXidErrors {xid}",
        )
    # The XID alert's value is the planted count; no other GPU alert is even pending.
    alerts = {
        (
            a["labels"]["alertname"],
            a["labels"]["gpu"],
            a["labels"].get("reason") or a["labels"]["xid"],
        ): (a["state"], float(a["value"]))
        for a in prom.alerts()
        if a["labels"]["alertname"] in GPU_ALERTS
    }
    print("GPU alerts:", alerts)
    assert alerts == {
        ("PDGPUThrottling", "2", "hw_slowdown"): ("firing", 1),
        ("PDGPUThrottling", "5", "hw_thermal_slowdown"): ("firing", 1),
        ("PDGPUXidErrors", "1", "13"): ("firing", 1),
        ("PDGPUXidErrors", "6", "79"): ("firing", 3),
    }

    # The driver goes away: no readings, NVML shown unavailable, telemetry alert; then back.
    stack.plant(replace(sick, init_error=DRIVER_NOT_LOADED))
    wait_until(lambda: prom.firing("PDGPUTelemetryMissing"), 30, "PDGPUTelemetryMissing")
    assert [v for _, v in shown(prom, nvml, time.time())] == [0]
    assert prom.query("pdstack_gpu_temperature_celsius", time.time()) == []
    stack.plant(sick)
    wait_until(lambda: not prom.firing("PDGPUTelemetryMissing"), 30, "NVML back")
    assert [v for _, v in shown(prom, nvml, time.time())] == [1]


def throttle_shown(prom: Prometheus, at: float | None = None) -> set[tuple[int, str]]:
    (expr,) = panel_exprs(UID, "Throttle reasons")
    found = set()
    for labels, value in shown(prom, expr, at if at is not None else time.time()):
        assert value == 1
        assert_labels(labels, int(labels["gpu"]))
        found.add((int(labels["gpu"]), labels["reason"]))
    return found


def assert_variables(prom: Prometheus, at: float) -> None:
    """gpu_role and numa_node offer what was planted, and choosing one shows only its GPUs."""
    offered = {}
    for variable in board()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
        assert match, variable["query"]
        series, label = match.groups()
        offered[variable["name"]] = {
            r["metric"][label] for r in prom.query(substitute(series), at) if label in r["metric"]
        }
    assert offered == {"host": {HOST}, "gpu_role": {"prefill", "decode"}, "numa_node": {"0", "1"}}
    (expr,) = panel_exprs(UID, "Temperature")
    for variable, value, gpus in (
        ("gpu_role", "prefill", PREFILL_GPUS),
        ("gpu_role", "decode", DECODE_GPUS),
        ("numa_node", "0", PREFILL_GPUS),
        ("numa_node", "1", DECODE_GPUS),
    ):
        chosen = expr.replace(f"${variable}", value)
        assert sorted(int(labels["gpu"]) for labels, _ in shown(prom, chosen, at)) == list(gpus)
