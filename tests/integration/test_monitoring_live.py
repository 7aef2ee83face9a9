"""The monitoring pack against live data: sim prefill + sim decode + the real gateway (smg) +
pd-exporter + node exporter, scraped by a real Prometheus (Debian's) configured from the
Prometheus role's own templates. Under load, every PromQL expression of every dashboard panel
and every rule must parse and return data, unless listed below with the reason it only has
data under failure. Then planted events must show their true count in every panel that reads
them (see PLANTED), and induced failures drive the matching alerts to firing: the decode
stopped (PDEngineDown) and the decode restarted alone (PDPairDegraded, the seed deployment's
production incident, until a coordinated restart heals the pair). Both sims run at TP4 as the
reference deployment does: counters every rank writes for the same event must read once, not
four times, in panels and rules."""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from monitoring.config import load
from monitoring.dashboards.export import expressions, render_dashboards
from monitoring.rules import render_rules
from pdctl.sim.scheduler_prefill import forces_prefill_retry
from pdctl.testing.etcd import local_etcd
from pdctl.testing.stack import Gateway, SimProc, free_port, stop_pid, wait_until
from pdctl.topology import dump
from tests.conftest import require_tool
from tests.integration.live_prometheus import (
    GPU_ONLY,
    GPU_PANELS,
    HOST,
    Prometheus,
    panel_counts,
    panel_exprs,
    render_prometheus_config,
    running_prometheus,
    stack_topology,
    start_exporter,
    start_process,
)
from tests.promql import metric_names, substitute

pytestmark = pytest.mark.gateway

TP = 4
PAIR = f"{HOST}/pd0"
RATE_INTERVAL = "30s"
# The decode's KV pool holds the main load (16 requests of ~57 tokens) but not RETRACT_LOAD
# at full length, so it retracts only when the test plants retractions.
DECODE_KV_POOL = 1600
RESERVED_DECODE_TOKENS = 8
DECODE_LOG_INTERVAL = 4
PEAK_S = 10  # the recorded transfer-failure rate against the truth: peaks over 10 s
RETRACT_LOAD = (8, 300)  # requests, max_new_tokens each
# The retraction gauge's plant (plant_last_interval_retraction): two requests whose KV at full
# length exceeds the pool by DECODE_LOG_INTERVAL slots, so the pool runs out a few steps before
# their end, with the prompt filling it at once (the sim's tokenizer: 4 characters a token).
GAUGE_PAIR_MAX_NEW = 24
GAUGE_PAIR_PROMPT = (DECODE_KV_POOL + DECODE_LOG_INTERVAL) // 2 - GAUGE_PAIR_MAX_NEW + 1
GAUGE_PLANT_TRIES = 5
PLANTED_BOOTSTRAP_FAILURES = 3
PLANT_WINDOW_S = 20
PLANTED_TRANSFER_FAILURES = 3
# What each side logs once per failed transfer (rank 0's line).
TRANSFER_FAILED = {
    "decode": "Decode transfer failed for request",
    "prefill": "Prefill transfer failed for request",
}
RETRACTED = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
# SGLang's test hook on the prefill, at a probability that no random rid (the gateway's, the
# canary's, health checks) is likely to meet in a run: only the planted rids, which it picks
# (sha256 of the rid), have their first prefill retried, each counted once on every rank.
FORCE_RETRY_PROB = 2**-20
RETRIED_RIDS = ("retry-61950", "retry-649782", "retry-890280", "retry-1470138")
PLANTED_PREFILL_RETRIES = 3  # the first rid creates the series
RETRY_YIELDED = "optimistic prefill yielded"
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
    "sglang:decode_deferred_kv_release_total": "written when a failed transfer's KV is released",
    "sglang:num_prefill_retries_total": "written at the first prefill retry (planted later)",
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
    ("pdstack-pipeline", "Deferred KV release (decode)"): "the outcome line: "
    + FAILURE_ONLY["sglang:decode_deferred_kv_release_total"],
    (
        "pdstack-pipeline",
        "Prefill retries and aborts",
    ): "retries (planted later) and aborts happen only under failure",
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
        for title in ("variable gpu_role", "variable numa_node", *GPU_PANELS)
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
    exporter_log: Path


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
    prefill = sim_factory(
        "prefill",
        env={**env, "SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB": str(FORCE_RETRY_PROB)},
        extra=("--tp-size", str(TP), "--optimistic-prefill-attempts", "2"),
    )
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
            str(DECODE_LOG_INTERVAL),
        ),
    )
    prefill.wait_healthy()
    decode.wait_healthy()
    gateway = gateway_factory([prefill], [decode]).wait_ready()
    topo_file = tmp_path / "topology.yaml"
    topo = stack_topology(prefill, decode, gateway, prefill_gpus=(0, 1), decode_gpus=(2, 3))
    topo_file.write_text(dump(topo))
    store = contextlib.ExitStack()
    etcd = store.enter_context(local_etcd(tmp_path / "etcd", tls=True))  # scraped as a member
    metrics_port = int(etcd.members[0].metrics_url.rsplit(":", 1)[1])
    ports = {"exporter": free_port(), "node": free_port(), "etcd": metrics_port}
    exporter_log = tmp_path / "exporter.log"
    procs = [
        start_exporter(
            topo_file,
            HOST,
            ports["exporter"],
            decode.log_path,
            exporter_log,
            "--canary-interval",
            "1",
            "--canary-timeout",
            "3",
        ),
        start_process(
            [str(node_exporter), f"--web.listen-address=127.0.0.1:{ports['node']}"],
            tmp_path / "node.log",
        ),
    ]
    try:
        config = render_prometheus_config(tmp_path / "prom", topo, HOST, ports, RULE_OVERRIDES)
        with running_prometheus(config, tmp_path, targets_up=6) as prom:
            yield Live(prom, gateway, prefill, decode, procs[0], exporter_log)
    finally:
        for proc in procs:
            stop_pid(proc)
        store.close()


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
    live.prom.wait_scrapes(2)  # the last requests' counters are stored, and a rate moved on

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
    for rule in yaml.safe_load(render_rules(load({"thresholds": RULE_OVERRIDES})))["groups"]:
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

    # A decode restarted alone keeps serving /health but the pair is broken (stale bootstrap)
    # until a coordinated restart heals it; the canary's failures in between are counted.
    start, canary_failed_before = quiet_canary(live)
    live.decode.restart().wait_healthy()
    wait_until(lambda: live.prom.firing("PDPairDegraded", pair=PAIR), 40, "PDPairDegraded")
    assert_counted_once(live.prom)
    restart_pair(live)
    assert_planted_canary_failures(live, start, canary_failed_before)

    # Degraded again, for the planted transfer failures.
    live.decode.restart().wait_healthy()
    wait_until(lambda: live.prom.firing("PDPairDegraded", pair=PAIR), 40, "PDPairDegraded")
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

    def settled() -> bool:
        # Every rank-0 series (born at the restart's first failure) older than the peaks'
        # window below, two seconds back, by 6 samples (1 s scrapes): no rate in that window is
        # a young series'. With 2-3 samples a rate extrapolates up to twice the truth, and the
        # rule, evaluated before the last scrape was stored, read fewer samples than a later
        # query does (its peak was 1.6 times the query's in CI 25, with 6 samples asked for).
        counts = prom.query(f'count_over_time({failures}{{tp_rank="0"}}[1m])')
        return bool(counts) and all(float(c["value"][1]) >= PEAK_S + 2 + 6 for c in counts)

    wait_until(settled, 60, "rank-0 transfer failure samples")
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
        for g in yaml.safe_load(render_rules(load({"thresholds": RULE_OVERRIDES})))["groups"]
        for r in g["rules"]
        if r.get("record") == record
    )
    rank0_5m = prom.by_label(rank0_rate.replace(RATE_INTERVAL, "5m"), at)
    assert prom.by_label(rule, at) == pytest.approx(rank0_5m)
    # The recorded series lags by up to one evaluation (and the canary keeps failing), so
    # compare peaks over the last evaluations: far from TP times the truth.
    rank0_5m_expr = rank0_rate.replace(RATE_INTERVAL, "5m")
    assert prom.by_label(f"max_over_time({record}[{PEAK_S}s])", at) == pytest.approx(
        prom.by_label(f"max_over_time(({rank0_5m_expr})[{PEAK_S}s:1s])", at), rel=0.5
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
# (assert_planted_transfer_failures), pair canary failures around it
# (assert_planted_canary_failures), the retraction gauge is checked in assert_planted_values.
# Every other panel reads a continuous signal (tokens, latencies, queues: checked for data
# above) or an event this stack cannot plant a known number of (docs/monitoring.md, "Not
# planted, and why").
PLANTED = {
    ("pdstack-pipeline", "Bootstrap failures", "num_bootstrap_failed_reqs"): "bootstrap",
    ("pdstack-pipeline", "Prefill retries and aborts", "num_aborted_requests"): "bootstrap",
    ("pdstack-pipeline", "Prefill retries and aborts", "num_prefill_retries"): "retry",
    ("pdstack-overview", "Errors", "num_aborted_requests"): "bootstrap",
    ("pdstack-decode", "Retractions", "num_retracted_requests"): "retraction",
}
# The engine that has each planted event; the other shows 0 or nothing.
PLANTED_ON = {"bootstrap": "decode", "retraction": "decode", "retry": "prefill"}


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


def long_request(
    url: str,
    max_new_tokens: int,
    text: str = "tell me about disaggregated serving",
    session: requests.Session | None = None,
) -> None:
    r = (session or requests).post(
        f"{url}/generate",
        timeout=120,
        json={
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == max_new_tokens


def retried_request(live: Live, rid: str, room: int) -> None:
    """A PD request whose first prefill SGLang's test hook throws away: one retry."""
    assert forces_prefill_retry(rid, FORCE_RETRY_PROB), rid
    assert pd_request(live.prefill, live.decode, room, rid) == 200


def plant(live: Live, bootstrap_failures: int, room: int, retried: tuple[str, ...]) -> None:
    """Bootstrap failures, prefill retries (the `retried` rids) and, at the same time, a load
    that the decode's pool can only serve by retracting; every request of that load and every
    retried request still succeeds."""
    n, max_new = RETRACT_LOAD
    with ThreadPoolExecutor(bootstrap_failures + len(retried) + n) as pool:
        jobs = (
            [
                pool.submit(dead_bootstrap_request, live.decode.url, room + i)
                for i in range(bootstrap_failures)
            ]
            + [
                pool.submit(retried_request, live, rid, room + 50 + i)
                for i, rid in enumerate(retried)
            ]
            + [pool.submit(long_request, live.gateway.url, max_new) for _ in range(n)]
        )
        for job in jobs:
            job.result()


def retractions(decode: SimProc) -> int:
    """Requests retracted so far, from the decode's own warnings."""
    return sum(int(m[1]) for m in RETRACTED.finditer(decode.log_text()))


def retraction_gauge_at_stats_lines(log: str) -> list[int]:
    """`num_retracted_reqs` as each of rank 0's `Decode batch` lines publishes it: the count
    of the last retraction since the line before (SGLang sets it per retraction, not adding
    up), 0 when none; the line resets it."""
    values, last = [], 0
    for line in log.splitlines():
        if m := RETRACTED.search(line):
            last = int(m[1])
        elif "Decode batch" in line:
            values.append(last)
            last = 0
    return values


def plant_last_interval_retraction(live: Live) -> int:
    """A retraction in the decode's last stats interval before it idles, so that the gauge
    holds a retraction's count (what a gauge never set cannot show), not the 0 of a load that
    ends with a few steps without one. Two requests sent together need DECODE_LOG_INTERVAL
    slots more than the pool at full length: it runs out when both have a few tokens left,
    SGLang retracts one, and that one resumes when the other finishes. From the retraction to
    the idle the decode runs what both have left less one step: the excess plus the slot
    left free at the retraction (0 or 1, by the parity of the pair's arrival offset) less
    one. DECODE_LOG_INTERVAL - 1 steps put exactly one stats line after the retraction,
    whatever the phase of the log interval; DECODE_LOG_INTERVAL steps put two when the
    retraction's step logs one too (one phase in DECODE_LOG_INTERVAL), the second publishing
    0, and an offset of DECODE_LOG_INTERVAL steps leaves no retraction: the pair is planted
    again (tests/unit/test_sim_retraction.py pins these step counts). Returns what the last
    stats line published."""
    text = "x" * 4 * GAUGE_PAIR_PROMPT
    url = live.gateway.url

    def together(start: threading.Barrier) -> None:
        # Connected before the barrier and sent at its release: on a loaded machine a thread
        # started later, or a connection made after the other request left, put the two
        # requests more steps apart than their overlap at the decode (no retraction).
        with requests.Session() as s:
            s.get(f"{url}/readiness", timeout=30).raise_for_status()
            start.wait(60)
            long_request(url, GAUGE_PAIR_MAX_NEW, text, s)

    for tries in range(1, GAUGE_PLANT_TRIES + 1):
        start = threading.Barrier(2)
        with ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(together, start) for _ in range(2)]
            for job in jobs:
                job.result()
        # The decode logs its last stats line before it answers the last request.
        if published := retraction_gauge_at_stats_lines(live.decode.log_text())[-1]:
            print("retraction gauge plant:", tries, "pair(s)")
            return published
    published_lately = retraction_gauge_at_stats_lines(live.decode.log_text())[-12:]
    pytest.fail(f"no pair retracted in the decode's last stats interval: {published_lately}")


def assert_planted_values(live: Live) -> None:
    """Each planted panel shows the planted count for the engine that had the events, over a
    window that holds exactly those events, not TP times it. SGLang (and the sim) create a
    labelled counter at its first event, which rate() cannot see, so a first round of the same
    events creates the series before the counted round."""
    decode = f"{HOST}/pd0-decode"
    first, *counted = RETRIED_RIDS
    assert len(counted) == PLANTED_PREFILL_RETRIES
    plant(live, 1, room=900_000, retried=(first,))
    live.prom.wait_scrapes(3)  # the created series is scraped, then two more scrapes
    start, retracted_before = time.time(), retractions(live.decode)
    retried_before = live.prefill.log_text().count(RETRY_YIELDED)
    plant(live, PLANTED_BOOTSTRAP_FAILURES, room=900_100, retried=tuple(counted))
    # A window long enough for rate()'s edge extrapolation to stay small, two scrapes after.
    end = live.prom.wait_window(start, PLANT_WINDOW_S)
    truth = {
        "bootstrap": PLANTED_BOOTSTRAP_FAILURES,
        "retraction": retractions(live.decode) - retracted_before,
        # the prefill's `Req RID optimistic prefill yielded (2/2 attempts used)` lines
        "retry": live.prefill.log_text().count(RETRY_YIELDED) - retried_before,
    }
    assert truth["retraction"] > 0, "the planted load did not make the decode retract"
    assert truth["retry"] == PLANTED_PREFILL_RETRIES, truth
    shown_by_panel = {}
    for (uid, title, metric), event in PLANTED.items():
        engine = f"{HOST}/pd0-{PLANTED_ON[event]}"
        (expr,) = panel_exprs(uid, title, f"sglang:{metric}")
        shown, rel = panel_counts(live.prom, expr, start, end)
        assert shown.get(engine) == pytest.approx(truth[event], rel=rel), (title, shown, truth)
        assert all(v == 0 for e, v in shown.items() if e != engine), (title, shown)
        shown_by_panel[f"{title}: {metric}"] = round(shown[engine], 2)
    print("planted:", truth, "shown:", shown_by_panel)
    # The gauge line of the Retractions panel: what rank 0's latest stats line published, a
    # retraction's count. The decode is idle then (the canary's one-token requests take no
    # decode step), logs no more stats lines, and the gauge holds. Over the window it showed
    # only values some stats line published (0 at startup).
    held = plant_last_interval_retraction(live)
    live.prom.wait_scrapes(2)
    settled = time.time()
    published = retraction_gauge_at_stats_lines(live.decode.log_text())
    (gauge,) = panel_exprs("pdstack-decode", "Retractions", "sglang:num_retracted_reqs")
    # held > 0: a gauge line that was never set (0) fails here.
    assert live.prom.by_label(substitute(gauge), settled) == {decode: held}
    window = math.ceil(settled - start)
    (history,) = live.prom.query(f"({substitute(gauge)})[{window}s:1s]", settled)
    assert {float(v) for _, v in history["values"]} <= {0.0, *map(float, published)}, history
    print("retraction gauge:", held, "published values:", sorted(set(published)))
    wait_until(lambda: live.prom.firing("PDBootstrapFailures", engine=decode), 30, "bootstrap")
    wait_until(lambda: live.prom.firing("PDDecodeRetractions", engine=decode), 30, "retract")
    # The alert's value is the failures of the last 5 minutes: the planted ones, not TP times.
    (alert,) = [a for a in live.prom.alerts() if a["labels"]["alertname"] == "PDBootstrapFailures"]
    assert PLANTED_BOOTSTRAP_FAILURES <= float(alert["value"]) < TP * PLANTED_BOOTSTRAP_FAILURES


def pd_request(prefill: SimProc, decode: SimProc, room: int, rid: str | None = None) -> int:
    """Both legs of one PD request, as the gateway sends them; the decode's status."""
    body: dict[str, object] = {
        "text": "a request through the pair",
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }
    if rid is not None:
        body["rid"] = rid
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(requests.post, f"{s.url}/generate", json=body, timeout=60)
                for s in (prefill, decode)]  # fmt: skip
        legs[0].result()
        return legs[1].result().status_code


def plant_transfer_failures(live: Live, n: int, room: int) -> None:
    with ThreadPoolExecutor(n) as pool:
        jobs = [pool.submit(pd_request, live.prefill, live.decode, room + i) for i in range(n)]
        assert [job.result() for job in jobs] == [500] * n


def assert_planted_transfer_failures(live: Live) -> None:
    """With the pair degraded (the decode restarted alone) every transfer fails, on both sides.
    The canary is stopped so that only the planted requests fail; the KV transfer failures
    panel then shows, for each engine, the failures it logged, once and not TP times. As in
    assert_planted_values, a first failure creates each side's series before the counted
    round (the canary's failures do not always reach the prefill's counter)."""
    stop_pid(live.exporter)
    time.sleep(3)  # the canary's last request (3 s timeout) has ended
    plant_transfer_failures(live, 1, room=910_000)
    live.prom.wait_scrapes(3)  # the created series is scraped, then two more scrapes

    def logged() -> dict[str, int]:
        return {
            f"{HOST}/pd0-{sim.mode}": sim.log_text().count(TRANSFER_FAILED[sim.mode])
            for sim in (live.prefill, live.decode)
        }

    start, before = time.time(), logged()
    plant_transfer_failures(live, PLANTED_TRANSFER_FAILURES, room=910_100)
    end = live.prom.wait_window(start, PLANT_WINDOW_S)
    truth = {e: n - before[e] for e, n in logged().items()}
    assert truth[f"{HOST}/pd0-decode"] == PLANTED_TRANSFER_FAILURES, truth
    (expr,) = panel_exprs(
        "pdstack-pipeline", "KV transfer failures", "sglang:num_transfer_failed_reqs"
    )
    shown, rel = panel_counts(live.prom, expr, start, end)
    for engine, n in truth.items():
        assert shown.get(engine, 0.0) == pytest.approx(n, rel=rel), (shown, truth)
    print("planted transfer failures:", truth, "shown:", shown)


def restart_pair(live: Live) -> None:
    """The coordinated restart that heals a degraded pair (what `pdctl restart --both` does):
    both engines stop, then both start."""
    live.decode.stop()
    live.prefill.stop()
    live.prefill.start()
    live.decode.start()
    live.prefill.wait_healthy()
    live.decode.wait_healthy()


def canary_failures(log: Path) -> int:
    """Failed canaries of the pair, from pd-exporter's log (one line each)."""
    text = log.read_text(errors="replace")
    return text.count(f"canary {PAIR}: ") - text.count(f"canary {PAIR}: recovered")


def quiet_canary(live: Live) -> tuple[float, int]:
    """Once the pair canary has logged no failure for three scrapes: (now, failures logged),
    an edge of a window that counts canary failures exactly."""
    last = {"count": canary_failures(live.exporter_log), "at": time.monotonic()}

    def quiet() -> bool:
        count = canary_failures(live.exporter_log)
        if count != last["count"]:
            last.update(count=count, at=time.monotonic())
        return time.monotonic() - last["at"] >= 3

    wait_until(quiet, 60, "a pair canary without failures", step=0.5)
    return time.time(), int(last["count"])


def assert_planted_canary_failures(live: Live, start: float, failed_before: int) -> None:
    """The window opens with the pair passing its canary, holds the degraded pair (the decode
    restarted alone, failing every canary) and closes after the coordinated restart, once
    the canary passes again: the Pair canary failures panel shows the failures pd-exporter
    logged in between."""
    end, failed_after = quiet_canary(live)
    truth = failed_after - failed_before
    assert truth > 0, "the degraded pair failed no canary"
    (expr,) = panel_exprs("pdstack-pipeline", "Pair canary failures")
    shown, rel = panel_counts(live.prom, expr, start, end, label="pair")
    assert shown == {PAIR: pytest.approx(truth, rel=rel)}, (shown, truth)
    print("planted canary failures:", truth, "shown:", shown)
