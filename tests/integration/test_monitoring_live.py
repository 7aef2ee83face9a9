"""The monitoring pack against live data: sim prefill + sim decode + the real gateway (smg) +
pd-exporter + node exporter, scraped by a real Prometheus (Debian's) configured from the
Prometheus role's own templates. Under load, every PromQL expression of every dashboard panel
and every rule must parse and return data, unless listed below with the reason it only has
data under failure. Then planted events must show their true count in every panel that reads
them (see PLANTED), and induced failures drive the matching alerts to firing: the decode
stopped (PDEngineDown) and the decode restarted alone (PDPairDegraded, the seed deployment's
production incident). Both sims run at TP4 as the reference deployment does: counters every
rank writes for the same event must read once, not four times, in panels and rules."""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from monitoring.dashboards.export import expressions, render_dashboards
from monitoring.promql import metric_names, substitute
from monitoring.rules_source import render_rules
from pdctl.testing.stack import Gateway, SimProc, free_port, stop_pid, wait_until
from pdctl.topology import Topology, dump
from tests.conftest import one_pair_topology, require_tool
from tests.integration.live_prometheus import (
    Prometheus,
    panel_counts,
    panel_exprs,
    render_prometheus_config,
    running_prometheus,
    start_process,
)

pytestmark = pytest.mark.gateway

HOST = "testhost"
TP = 4
PAIR = f"{HOST}/pd0"
RATE_INTERVAL = "30s"
# The decode's KV pool holds the main load (16 requests of ~57 tokens) but not RETRACT_LOAD
# at full length, so it retracts only when the test plants retractions.
DECODE_KV_POOL = 1600
RESERVED_DECODE_TOKENS = 8
RETRACT_LOAD = (8, 300)  # requests, max_new_tokens each
PLANTED_BOOTSTRAP_FAILURES = 3
PLANT_WINDOW_S = 20
PLANTED_TRANSFER_FAILURES = 3
# What each side logs once per failed transfer (rank 0's line).
TRANSFER_FAILED = {
    "decode": "Decode transfer failed for request",
    "prefill": "Prefill transfer failed for request",
}
RETRACTED = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
# Hold times short enough to watch alerts fire within the test, and SLOs of 1 ms so that the
# SLO alerts fire on the live latencies.
RULE_OVERRIDES: dict[str, object] = {
    **{
        f"{k}_for": "2s"
        for k in (
            "down",
            "canary",
            "eager",
            "kv_usage",
            "slo",
            "throttle",
            "pd_failures",
            "hang",
            "kv_leak",
            "retract",
        )
    },
    "ttft_p95_seconds": 0.001,
    "itl_p95_seconds": 0.001,
}

# Metric families that exist only after a failure or only on GPU hosts, with the reason.
FAILURE_ONLY = {
    "sglang:num_bootstrap_failed_reqs_total": "written at the first failed bootstrap",
    "sglang:num_transfer_failed_reqs_total": "written at the first failed KV transfer",
    "sglang:num_prefill_retries_total": "written at the first prefill retry",
    "sglang:num_aborted_requests_total": "written at the first aborted request",
    "sglang:num_retracted_requests_total": "written at the first retraction (planted later)",
    "engine:sglang_retracted_requests:rate5m": "recorded from the retraction counter",
    "smg_router_request_errors_total": "written at the first gateway error",
    "smg_worker_errors_total": "written at the first worker error",
    "smg_worker_overload_shed_total": "written at the first request shed for overload",
    "smg_pd_admission_sheds_total": "written at the first PD admission shed",
    "smg_worker_stalled": "written when the gateway first vetoes a worker",
    "pdstack_gpu_xid_errors_total": "needs NVML (GPU host) and an XID event",
}
GPU_ONLY = "needs NVML: the test host has no GPU (pdstack_gpu_up is 0)"
# Expressions allowed to return nothing here: (dashboard uid or "rules", panel or rule) ->
# why. Every alert is silent on a healthy stack except the two that this host really has.
NO_DATA = {
    ("pdstack-overview", "Errors"): "aborted requests and 5xx happen only under failure",
    ("pdstack-pipeline", "Bootstrap failures"): FAILURE_ONLY[
        "sglang:num_bootstrap_failed_reqs_total"
    ],
    ("pdstack-pipeline", "KV transfer failures"): FAILURE_ONLY[
        "sglang:num_transfer_failed_reqs_total"
    ],
    (
        "pdstack-pipeline",
        "Prefill retries and aborts",
    ): "retries and aborts happen only under failure",
    ("pdstack-gateway", "Failed health checks"): "only when a worker fails a health check",
    ("pdstack-gateway", "Gateway errors by type"): FAILURE_ONLY["smg_router_request_errors_total"],
    ("pdstack-gateway", "Worker errors"): FAILURE_ONLY["smg_worker_errors_total"],
    ("pdstack-gateway", "Load shed"): "only when the gateway sheds load",
    ("pdstack-gateway", "Stalled workers"): FAILURE_ONLY["smg_worker_stalled"],
    ("rules", "engine:sglang_retracted_requests:rate5m"): "retraction counter, see FAILURE_ONLY",
    ("pdstack-decode", "Retractions"): "the rate line: retractions are planted later",
    ("rules", "engine:sglang_bootstrap_failed_reqs:rate5m"): "failure counter, see FAILURE_ONLY",
    ("rules", "engine:sglang_transfer_failed_reqs:rate5m"): "failure counter, see FAILURE_ONLY",
    **{
        ("pdstack-gpus", title): GPU_ONLY
        for title in (
            "variable gpu_role",
            "variable numa_node",
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
    },
}
ALERTS_WITH_DATA_HERE = {
    "PDGPUTelemetryMissing": "no NVML on the test host",
    "PDDecodeEagerFallback": "the load runs 16 concurrent requests; the decode graphs stop at 8",
    "PDTTFTSLOBreach": "RULE_OVERRIDES sets a 1 ms SLO",
    "PDITLSLOBreach": "RULE_OVERRIDES sets a 1 ms SLO",
}


@dataclass
class Live:
    prom: Prometheus
    gateway: Gateway
    prefill: SimProc
    decode: SimProc
    exporter: subprocess.Popen[bytes]  # its pair canary sends a request every second


def topology(prefill: SimProc, decode: SimProc, gateway: Gateway) -> Topology:
    return one_pair_topology(
        HOST,
        prefill.url,
        decode.url,
        bootstrap_port=prefill.bootstrap_port,
        router_url=gateway.url,
        metrics_url=f"http://127.0.0.1:{gateway.metrics_port}/metrics",
        prefill_gpus=(0, 1),
        decode_gpus=(2, 3),
    )


def generate_load(url: str, seconds: float, concurrency: int) -> int:
    stop = time.monotonic() + seconds
    done = [0]

    def worker() -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            with contextlib.suppress(requests.RequestException):
                session.post(
                    f"{url}/generate",
                    timeout=30,
                    json={
                        "text": "tell me about disaggregated serving",
                        "sampling_params": {"max_new_tokens": 48, "temperature": 0},
                    },
                )
                done[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


@pytest.fixture
def live(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> Iterator[Live]:
    node_exporter = require_tool("prometheus-node-exporter")
    # The degraded pair after a lone decode restart is the modelled production incident: real
    # NIXL over host memory heals it (docs/sim.md), so the alert test switches the model on.
    env = {"PDSIM_DEGRADED": "on", "PDSIM_DEGRADED_FAIL_RATIO": "1"}
    prefill = sim_factory("prefill", env=env, extra=("--tp-size", str(TP)))
    decode = sim_factory(
        "decode",
        env={**env, "PDSIM_KV_POOL_TOKENS": str(DECODE_KV_POOL)},
        extra=(
            "--num-reserved-decode-tokens",
            str(RESERVED_DECODE_TOKENS),
            "--tp-size",
            str(TP),
            "--cuda-graph-max-bs-decode",
            "8",
            "--max-running-requests",
            "32",
            "--decode-log-interval",
            "4",
        ),
    )
    prefill.wait_healthy()
    decode.wait_healthy()
    gateway = gateway_factory([prefill], [decode]).wait_ready()
    topo_file = tmp_path / "topology.yaml"
    topo = topology(prefill, decode, gateway)
    topo_file.write_text(dump(topo))
    ports = {"exporter": free_port(), "node": free_port()}
    procs = [
        start_process(
            [
                sys.executable,
                "-m",
                "pdctl.exporter",
                "--topology",
                str(topo_file),
                "--host",
                HOST,
                "--port",
                str(ports["exporter"]),
                "--canary-interval",
                "1",
                "--canary-timeout",
                "3",
                "--journal-file",
                f"pd0-decode={decode.log_path}",
            ],
            tmp_path / "exporter.log",
        ),
        start_process(
            [str(node_exporter), f"--web.listen-address=127.0.0.1:{ports['node']}"],
            tmp_path / "node.log",
        ),
    ]
    try:
        config = render_prometheus_config(tmp_path / "prom", topo, HOST, ports, RULE_OVERRIDES)
        with running_prometheus(config, tmp_path, targets_up=5) as prom:
            yield Live(prom, gateway, prefill, decode, procs[0])
    finally:
        for proc in procs:
            stop_pid(proc)


def unseen_names(prom: Prometheus, expr: str) -> set[str]:
    """Metric names the expression selects that Prometheus has no series of, except those
    explained in FAILURE_ONLY and the GPU readings (no NVML here)."""
    return {
        n
        for n in metric_names(expr)
        if n not in FAILURE_ONLY
        and not (n.startswith("pdstack_gpu_") and n != "pdstack_gpu_up")
        and not prom.has_series(n)
    }


def test_every_expression_has_data_and_failures_fire(live: Live) -> None:
    assert generate_load(live.gateway.url, seconds=15, concurrency=16) > 20
    time.sleep(3)  # two more scrapes after the last request

    empty: list[tuple[str, str]] = []
    unseen: set[str] = set()
    for text in render_dashboards().values():
        board = json.loads(text)
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
            assert match, variable["query"]
            series, label = match.groups()
            if not any(label in r["metric"] for r in live.prom.query(substitute(series))):
                empty.append((board["uid"], f"variable {variable['name']}"))
        for title, expr in expressions(board):
            if not live.prom.query(substitute(expr, RATE_INTERVAL)):
                empty.append((board["uid"], title))
            unseen |= unseen_names(live.prom, expr)
    for rule in yaml.safe_load(render_rules(RULE_OVERRIDES))["groups"]:
        for r in rule["rules"]:
            name, result = r.get("record") or r["alert"], live.prom.query(r["expr"])
            unseen |= unseen_names(live.prom, r["expr"])
            if "record" in r and not result:
                empty.append(("rules", name))
            if "alert" in r and bool(result) != (name in ALERTS_WITH_DATA_HERE):
                empty.append(("rules", f"{name} {'fires' if result else 'is silent'}"))
    assert not unseen, f"metric names Prometheus never saw: {sorted(unseen)}"
    print("no data (explained):", sorted(set(empty)))
    unexplained = sorted(set(empty) - set(NO_DATA))
    assert not unexplained, f"expressions without data: {unexplained}"

    # The alerts this host really has fire through the rule files Prometheus loaded.
    for alert in ("PDGPUTelemetryMissing", "PDTTFTSLOBreach", "PDITLSLOBreach"):
        wait_until(lambda a=alert: live.prom.firing(a), 20, alert)
    wait_until(
        lambda: live.prom.firing("PDDecodeEagerFallback", engine=f"{HOST}/pd0-decode"),
        20,
        "PDDecodeEagerFallback",
    )

    assert_planted_values(live)

    # A decode restarted alone keeps serving /health but the pair is broken (stale bootstrap).
    live.decode.restart().wait_healthy()
    wait_until(lambda: live.prom.firing("PDPairDegraded", pair=PAIR), 40, "PDPairDegraded")

    assert_counted_once(live.prom)
    assert_planted_transfer_failures(live)

    # The decode stopped: its engine is down (and the pair alert yields to it)...
    live.decode.stop()
    wait_until(
        lambda: live.prom.firing("PDEngineDown", engine=f"{HOST}/pd0-decode"), 30, "PDEngineDown"
    )
    # ...and the gateway's health checks take it out of rotation.
    wait_until(
        lambda: live.prom.firing("PDGatewayWorkerUnhealthy", worker=live.decode.url),
        30,
        "PDGatewayWorkerUnhealthy",
    )


def assert_counted_once(prom: Prometheus) -> None:
    """Each TP rank counts every failed transfer; the panels and rules must show the count
    of one rank (the number of failed requests), not TP times it."""
    failures = "sglang:num_transfer_failed_reqs_total"
    wait_until(lambda: bool(prom.query(f'{failures}{{tp_rank="3"}}')), 30, "transfer failures")
    time.sleep(3)
    at = time.time() - 2  # a settled instant, the same for every query below
    truth = prom.by_label(f'sum by (engine) ({failures}{{tp_rank="0"}})', at)
    assert truth and all(v > 0 for v in truth.values()), truth
    assert prom.by_label(f"sum by (engine) ({failures})", at) == {
        e: TP * v for e, v in truth.items()
    }, "every rank writes the counter"
    panel = next(
        e
        for b in map(json.loads, render_dashboards().values())
        for t, e in expressions(b)
        if t == "KV transfer failures"
    )
    rank0_rate = f'sum by (engine) (rate({failures}{{tp_rank="0"}}[{RATE_INTERVAL}]))'
    assert prom.by_label(substitute(panel, RATE_INTERVAL), at) == pytest.approx(
        prom.by_label(rank0_rate, at)
    )
    record = "engine:sglang_transfer_failed_reqs:rate5m"
    rule = next(
        r["expr"]
        for g in yaml.safe_load(render_rules(RULE_OVERRIDES))["groups"]
        for r in g["rules"]
        if r.get("record") == record
    )
    rank0_5m = prom.by_label(rank0_rate.replace(RATE_INTERVAL, "5m"), at)
    assert prom.by_label(rule, at) == pytest.approx(rank0_5m)
    # The recorded series lags by up to one evaluation (and the canary keeps failing), so
    # compare peaks over the last evaluations: far from TP times the truth.
    rank0_5m_expr = rank0_rate.replace(RATE_INTERVAL, "5m")
    assert prom.by_label(f"max_over_time({record}[10s])", at) == pytest.approx(
        prom.by_label(f"max_over_time(({rank0_5m_expr})[10s:1s])", at), rel=0.5
    )
    passes = "sglang:cuda_graph_passes_total"
    decode_panel = next(
        e
        for b in map(json.loads, render_dashboards().values())
        for t, e in expressions(b)
        if t == "Decode passes by mode"
    )
    got = sum(float(r["value"][1]) for r in prom.query(substitute(decode_panel, RATE_INTERVAL), at))
    want = prom.query(f'sum(rate({passes}{{tp_rank="0", mode=~"decode_.*"}}[{RATE_INTERVAL}]))', at)
    assert got == pytest.approx(float(want[0]["value"][1]))


# Panels planted on the healthy pair: (dashboard uid, panel title, metric the expression
# reads) -> planted event. KV transfer failures are planted on the degraded pair
# (assert_planted_transfer_failures). Every other panel reads a continuous signal (tokens,
# latencies, queues: checked for data above) or an event this stack cannot plant a known
# number of (docs/monitoring.md, "Not planted, and why").
PLANTED = {
    ("pdstack-pipeline", "Bootstrap failures", "num_bootstrap_failed_reqs"): "bootstrap",
    ("pdstack-pipeline", "Prefill retries and aborts", "num_aborted_requests"): "bootstrap",
    ("pdstack-overview", "Errors", "num_aborted_requests"): "bootstrap",
    ("pdstack-decode", "Retractions", "num_retracted_requests"): "retraction",
}


def dead_bootstrap_request(decode_url: str, room: int) -> None:
    """A decode leg whose prefill bootstrap port answers nothing: after SGLang's 15 route
    tries, one bootstrap failure (on every rank) and one aborted request on the decode."""
    r = requests.post(
        f"{decode_url}/generate",
        timeout=60,
        json={
            "text": "no prefill behind this bootstrap port",
            "sampling_params": {"max_new_tokens": 1},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": free_port(),  # one port each: the decode retries a host serially
            "bootstrap_room": room,
        },
    )
    assert r.status_code == 500, r.text


def long_request(url: str, max_new_tokens: int) -> None:
    r = requests.post(
        f"{url}/generate",
        timeout=120,
        json={
            "text": "tell me about disaggregated serving",
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == max_new_tokens


def plant(live: Live, bootstrap_failures: int, room: int) -> None:
    """Bootstrap failures and, at the same time, a load that the decode's pool can only serve
    by retracting; every request of that load still succeeds."""
    n, max_new = RETRACT_LOAD
    with ThreadPoolExecutor(bootstrap_failures + n) as pool:
        jobs = [
            pool.submit(dead_bootstrap_request, live.decode.url, room + i)
            for i in range(bootstrap_failures)
        ] + [pool.submit(long_request, live.gateway.url, max_new) for _ in range(n)]
        for job in jobs:
            job.result()


def retractions(decode: SimProc) -> int:
    """Requests retracted so far, from the decode's own warnings."""
    return sum(int(m[1]) for m in RETRACTED.finditer(decode.log_text()))


def assert_planted_values(live: Live) -> None:
    """Each planted panel shows the planted count for the engine that had the events, over a
    window that holds exactly those events, not TP times it. SGLang (and the sim) create a
    labelled counter at its first event, which rate() cannot see, so a first round of the same
    events creates the series before the counted round."""
    decode = f"{HOST}/pd0-decode"
    plant(live, 1, room=900_000)
    time.sleep(4)  # the created series is scraped, then two more scrapes
    start, retracted_before = time.time(), retractions(live.decode)
    plant(live, PLANTED_BOOTSTRAP_FAILURES, room=900_100)
    # Two more scrapes, and a window long enough for rate()'s edge extrapolation to stay small.
    time.sleep(max(3.0, start + PLANT_WINDOW_S - time.time()))
    end = time.time()
    truth = {
        "bootstrap": PLANTED_BOOTSTRAP_FAILURES,
        "retraction": retractions(live.decode) - retracted_before,
    }
    assert truth["retraction"] > 0, "the planted load did not make the decode retract"
    for (uid, title, metric), event in PLANTED.items():
        (expr,) = panel_exprs(uid, title, f"sglang:{metric}")
        shown, rel = panel_counts(live.prom, expr, start, end)
        assert shown.get(decode) == pytest.approx(truth[event], rel=rel), (title, shown, truth)
        assert all(v == 0 for e, v in shown.items() if e != decode), (title, shown)
    # The gauge line of the Retractions panel is rank 0's count since its previous stats line,
    # reset at the next one (decode-log-interval steps later): a scrape rarely catches it, and
    # it never shows more than happened.
    (gauge,) = panel_exprs("pdstack-decode", "Retractions", "sglang:num_retracted_reqs")
    window = math.ceil(end - start)
    peak = live.prom.query(f"max_over_time(({substitute(gauge)})[{window}s:1s])", end)
    assert 0 <= float(peak[0]["value"][1]) <= truth["retraction"], peak
    print("planted:", truth, "gauge peak:", peak[0]["value"][1])
    wait_until(lambda: live.prom.firing("PDBootstrapFailures", engine=decode), 30, "bootstrap")
    wait_until(lambda: live.prom.firing("PDDecodeRetractions", engine=decode), 30, "retract")
    # The alert's value is the failures of the last 5 minutes: the planted ones, not TP times.
    (alert,) = [a for a in live.prom.alerts() if a["labels"]["alertname"] == "PDBootstrapFailures"]
    assert PLANTED_BOOTSTRAP_FAILURES <= float(alert["value"]) < TP * PLANTED_BOOTSTRAP_FAILURES


def pd_request(prefill: SimProc, decode: SimProc, room: int) -> None:
    """Both legs of one PD request, as the gateway sends them."""
    body = {
        "text": "a transfer through the degraded pair",
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(requests.post, f"{s.url}/generate", json=body, timeout=60)
                for s in (prefill, decode)]  # fmt: skip
        assert legs[1].result().status_code == 500, legs[1].result().text
        legs[0].result()


def plant_transfer_failures(live: Live, n: int, room: int) -> None:
    with ThreadPoolExecutor(n) as pool:
        for job in [pool.submit(pd_request, live.prefill, live.decode, room + i) for i in range(n)]:
            job.result()


def assert_planted_transfer_failures(live: Live) -> None:
    """With the pair degraded (the decode restarted alone) every transfer fails, on both sides.
    The canary is stopped so that only the planted requests fail; the KV transfer failures
    panel then shows, for each engine, the failures it logged, once and not TP times. As in
    assert_planted_values, a first failure creates each side's series before the counted
    round (the canary's failures do not always reach the prefill's counter)."""
    stop_pid(live.exporter)
    time.sleep(3)  # the canary's last request (3 s timeout) has ended
    plant_transfer_failures(live, 1, room=910_000)
    time.sleep(4)  # the created series is scraped, then two more scrapes

    def logged() -> dict[str, int]:
        return {
            f"{HOST}/pd0-{sim.mode}": sim.log_text().count(TRANSFER_FAILED[sim.mode])
            for sim in (live.prefill, live.decode)
        }

    start, before = time.time(), logged()
    plant_transfer_failures(live, PLANTED_TRANSFER_FAILURES, room=910_100)
    time.sleep(max(3.0, start + PLANT_WINDOW_S - time.time()))
    end = time.time()
    truth = {e: n - before[e] for e, n in logged().items()}
    assert truth[f"{HOST}/pd0-decode"] == PLANTED_TRANSFER_FAILURES, truth
    (expr,) = panel_exprs(
        "pdstack-pipeline", "KV transfer failures", "sglang:num_transfer_failed_reqs"
    )
    shown, rel = panel_counts(live.prom, expr, start, end)
    for engine, n in truth.items():
        assert shown.get(engine, 0.0) == pytest.approx(n, rel=rel), (shown, truth)
    print("planted transfer failures:", truth, "shown:", shown)
