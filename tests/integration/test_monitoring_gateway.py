"""The gateway panels against live data: sim prefill + sim decode behind the real gateway
(smg, retries off), scraped by a real Prometheus configured from the Prometheus role's own
templates. Planted gateway events must show their true count in every panel that reads them:
requests smg refuses (no worker serves the model: 503) or that the prefill rejects (400),
requests smg sheds while both engines report a waiting queue (503
worker_overload_protection_shed), requests the degraded pair fails (500 from the decode, a
worker error on both legs) until both circuit breakers open, and failed health checks while
the decode is stopped, with the alerts they drive; the prefill's planted latency shows in the
PD prefill duration panel. The truth is the test's own client counts, the sim's configured
latency and smg's own log lines, never the metric under test."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from pdctl.testing.stack import Gateway, SimProc, free_port, wait_until
from tests.integration.conftest import FAST_SIM_ENV
from tests.integration.live_prometheus import (
    HOST,
    Prometheus,
    panel_counts,
    panel_exprs,
    render_prometheus_config,
    running_prometheus,
    stack_topology,
)
from tests.promql import substitute

pytestmark = pytest.mark.gateway

PLANT_WINDOW_S = 20
# Hold times short enough to watch the gateway alerts fire within the test.
RULE_OVERRIDES: dict[str, object] = {
    "down_for": "2s",
    "gateway_errors_for": "2s",
    "shed_for": "2s",
}
# Planted in the counted round (a first round of one each creates the series).
# Requests for a model no worker serves: 503 no_available_workers (error_type unavailable),
# the answer an open breaker gives too.
UNKNOWN_MODEL = 3
TOO_LONG = 2  # more tokens than the context: the prefill's 400, error_type validation_error
FAILED_PD = 3  # requests through the degraded pair: the decode's 500
# Consecutive failures that open a worker's breaker: within the planted round, whether or not
# smg counts the first round's failure (a breaker opened there would hide the planted ones).
CB_FAILURES = 2
SERVED_PD = 3  # requests the healthy pair serves
# Load shedding: the decode runs one request at a time, so a burst of long requests leaves
# the rest queued on both engines (the decode's prealloc queue, the prefill's bootstrap
# queue), which each reports as waiting requests on /v1/loads. smg polls that every second
# and, with shedding on, refuses requests while every worker has OVERLOAD_WAITING waiting.
# A PD request in flight counts as waiting on the decode until its KV arrives, and a health
# check on either engine: one of each at a poll stays under the threshold.
OVERLOAD_WAITING = 3
BURST = OVERLOAD_WAITING + 2
BURST_TOKENS = 2000  # about 2.5 s of decode each (wall time)
SHED = 3
SHED_CODE = "worker_overload_protection_shed"
# Every prefill batch takes at least this long (wall time).
PREFILL_WALL_S = 0.55
# smg's log lines (at info) naming the worker: one per failed probe, one per breaker
# transition.
PROBE_FAILED = re.compile(r"Health probe failed .*?worker_url=(?P<worker>http://[\d.:]+)")
CB_TRANSITION = re.compile(
    r"Circuit breaker state transition: \w+ -> (?P<to>\w+) .*?worker_url=(?P<worker>http://[\d.:]+)"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Stack:
    prom: Prometheus
    gateway: Gateway
    prefill: SimProc
    decode: SimProc


@pytest.fixture
def stack(
    sim_factory: Callable[..., SimProc], gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> Iterator[Stack]:
    # A decode restarted alone fails every transfer with a 500 (docs/sim.md, degraded pair).
    env = {"PDSIM_DEGRADED": "on", "PDSIM_DEGRADED_FAIL_RATIO": "1"}
    # The burst's queued requests wait for the decode well past the fast default deadline.
    env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = "600"
    prefill_base_ms = PREFILL_WALL_S * 1000 / float(FAST_SIM_ENV["PDSIM_TIME_SCALE"])
    prefill = sim_factory("prefill", env={**env, "PDSIM_PREFILL_BASE_MS": str(prefill_base_ms)})
    decode = sim_factory("decode", env=env, extra=("--max-running-requests", "1"))
    prefill.wait_healthy()
    decode.wait_healthy()
    # Retries off: every planted request is one upstream attempt. An open breaker stays open
    # for the rest of the test. Info logs name each breaker transition. Loads are polled
    # every second; OVERLOAD_WAITING waiting requests mark a worker overloaded, which sheds.
    gateway = gateway_factory(
        [prefill], [decode], "--disable-retries", "--cb-failure-threshold", str(CB_FAILURES),
        "--cb-timeout-duration-secs", "600", "--log-level", "info",
        "--load-monitor-interval", "1", "--worker-overload-waiting-requests", str(OVERLOAD_WAITING),
        "--worker-overload-shed",
    ).wait_ready()  # fmt: skip
    topo = stack_topology(prefill, decode, gateway)
    # No pd-exporter or node exporter: their targets stay down (no panel here reads them).
    ports = {"exporter": free_port(), "node": free_port()}
    config = render_prometheus_config(tmp_path, topo, HOST, ports, RULE_OVERRIDES)
    with running_prometheus(config, tmp_path, targets_up=3) as prom:
        yield Stack(prom, gateway, prefill, decode)


def post_generate(url: str, max_new_tokens: int) -> requests.Response:
    return requests.post(
        f"{url}/generate",
        timeout=60,
        json={"text": "hello gateway", "sampling_params": {"max_new_tokens": max_new_tokens}},
    )


def generate(url: str, max_new_tokens: int) -> int:
    return post_generate(url, max_new_tokens).status_code


def timed_generate(url: str, max_new_tokens: int) -> tuple[int, float]:
    """A request's status and its duration as the client saw it."""
    r = post_generate(url, max_new_tokens)
    return r.status_code, r.elapsed.total_seconds()


def answer(url: str, max_new_tokens: int) -> tuple[str, str]:
    """A request's status and smg's error code ("ok" for a 200): the `status_code` and
    `error_code` labels smg counts the response under (smg_http_responses_total)."""
    r = post_generate(url, max_new_tokens)
    return str(r.status_code), r.json()["error"]["code"] if r.status_code != 200 else "ok"


def unknown_model(url: str) -> int:
    r = requests.post(
        f"{url}/generate",
        timeout=60,
        json={"model": "no-such-model", "text": "hi", "sampling_params": {"max_new_tokens": 1}},
    )
    return r.status_code


def plant_refusals(url: str, unknown: int, too_long: int) -> Counter[int]:
    """Requests smg refuses itself and requests the prefill rejects; their statuses."""
    statuses = [unknown_model(url) for _ in range(unknown)]
    statuses += [generate(url, 10_000_000) for _ in range(too_long)]
    return Counter(statuses)


def counted_round(
    prom: Prometheus, plant: Callable[[], object], created: Callable[[], object] | None
) -> tuple[float, float]:
    """smg creates a labelled counter at its first event, which rate() cannot see: a first
    round of the same events creates the series (None: smg exports it from its start), then
    the planted round runs in a window that holds only it. The window's [start, end]."""
    if created is not None:
        created()
        prom.wait_scrapes(3)  # the created series is scraped, then two more scrapes
    start = time.time()
    plant()
    return start, prom.wait_window(start, PLANT_WINDOW_S)


def assert_panel(
    prom: Prometheus,
    uid: str,
    title: str,
    metric: str,
    window: tuple[float, float],
    label: str,
    truth: dict[str, int],
) -> None:
    """The panel's expression that reads `metric` shows `truth` per `label`, and nothing else."""
    (expr,) = panel_exprs(uid, title, metric)
    shown, rel = panel_counts(prom, expr, *window, label=label)
    for key, n in truth.items():
        assert shown.get(key, 0.0) == pytest.approx(n, rel=rel), (title, shown, truth)
    assert all(v == 0 for k, v in shown.items() if k not in truth), (title, shown, truth)
    print(f"{title} ({metric}): planted {truth}, shown {shown}")


def overloaded(gateway: Gateway) -> bool:
    """smg counts a model's workers as overloaded (from the loads it polled)."""
    text = requests.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10).text
    return any(
        line.startswith("smg_workers_overloaded{") and float(line.split()[-1]) > 0
        for line in text.splitlines()
    )


def plant_shed(gateway: Gateway, burst: int, shed: int) -> tuple[Counter[int], Counter[str]]:
    """A burst that queues on both engines; once smg has polled the queues, `shed` more
    requests. The burst's statuses and the later requests' error codes (or "ok")."""
    with ThreadPoolExecutor(burst) as pool:
        running = [pool.submit(generate, gateway.url, BURST_TOKENS) for _ in range(burst)]
        wait_until(lambda: overloaded(gateway), 30, "smg to see the queues")
        codes = Counter(answer(gateway.url, 4)[1] for _ in range(shed))
        return Counter(f.result() for f in running), codes


def logged(gateway: Gateway, line: re.Pattern[str]) -> Counter[str]:
    """smg's log lines matching `line`, per worker URL."""
    return Counter(m["worker"] for m in line.finditer(smg_log(gateway)))


def smg_log(gateway: Gateway) -> str:
    return ANSI.sub("", gateway.log_path.read_text(errors="replace"))


def test_gateway_panels_show_planted_events(stack: Stack) -> None:
    url, prom = stack.gateway.url, stack.prom

    # Refusals: smg's own 503 (no worker serves the model) and the prefill's 400.
    got: Counter[int] = Counter()
    window = counted_round(
        prom,
        lambda: got.update(plant_refusals(url, UNKNOWN_MODEL, TOO_LONG)),
        lambda: plant_refusals(url, 1, 1),
    )
    assert got == {503: UNKNOWN_MODEL, 400: TOO_LONG}, got
    assert_panel(
        prom,
        "pdstack-gateway",
        "Gateway errors by type",
        "smg_router_request_errors_total",
        window,
        "error_type",
        {"unavailable": UNKNOWN_MODEL, "validation_error": TOO_LONG},
    )
    assert_panel(
        prom,
        "pdstack-overview",
        "Errors",
        "smg_http_responses_total",
        window,
        "status_code",
        {"503": UNKNOWN_MODEL},
    )
    wait_until(lambda: prom.firing("PDGatewayErrors"), 30, "PDGatewayErrors")

    # Requests the healthy pair serves: each prefill leg takes PREFILL_WALL_S or more, and
    # ends before the gateway answers the client. The quantiles interpolate within buckets,
    # so they lie between the bucket edges around those bounds.
    served: list[tuple[int, float]] = []
    window = counted_round(
        prom,
        lambda: served.extend(timed_generate(url, 4) for _ in range(SERVED_PD)),
        lambda: timed_generate(url, 4),
    )
    assert [status for status, _ in served] == [200] * SERVED_PD, served
    edges = sorted(
        float(r["metric"]["le"])
        for r in prom.query("count by (le) (smg_pd_prefill_duration_seconds_bucket)")
    )
    low = max(e for e in edges if e <= PREFILL_WALL_S)
    high = min(e for e in edges if e >= max(elapsed for _, elapsed in served))
    for expr in panel_exprs("pdstack-gateway", "PD prefill duration"):
        rate_window = f"{math.ceil(window[1] - window[0])}s"
        shown = prom.by_label(substitute(expr, rate_window), window[1], label="instance")
        assert shown and all(low <= v <= high for v in shown.values()), (shown, low, high)
        print(f"PD prefill duration: planted {PREFILL_WALL_S} s, client {served}, shown {shown}")

    # Load shedding: every shed request is refused by smg itself (503, SHED_CODE), counted
    # at selection; the burst behind it is served. smg exports the counter from its start.
    planted: list[tuple[Counter[int], Counter[str]]] = []
    window = counted_round(
        prom, lambda: planted.append(plant_shed(stack.gateway, BURST, SHED)), None
    )
    ((burst, shed),) = planted
    assert burst == {200: BURST} and shed == {SHED_CODE: SHED}, (burst, shed)
    assert_panel(
        prom,
        "pdstack-gateway",
        "Load shed",
        "smg_worker_overload_shed_total",
        window,
        "stage",
        {"selection": SHED},
    )
    wait_until(lambda: prom.firing("PDGatewayLoadShedding"), 30, "PDGatewayLoadShedding")
    wait_until(lambda: not overloaded(stack.gateway), 30, "the queues to drain")

    # The decode restarted alone after those transfers: the pair is degraded, every PD
    # request fails with the decode's 500, which smg records as a worker error on both legs
    # and as a failure on both breakers; CB_FAILURES in a row open one (smg logs which).
    # It starts again once smg has probed it down (one line per failed probe in smg's log):
    # that creates the failure series the health-check panel is read from below (a sim is
    # back within 0.3 s, sooner than smg's next probe).
    decode_url = stack.decode.url
    before = logged(stack.gateway, PROBE_FAILED)[decode_url]
    stack.decode.stop()
    wait_until(
        lambda: logged(stack.gateway, PROBE_FAILED)[decode_url] > before, 30, "a failed probe"
    )
    stack.decode.start().wait_healthy()
    stack.gateway.wait_ready()
    transitions = logged(stack.gateway, CB_TRANSITION)
    answers: Counter[tuple[str, str]] = Counter()
    window = counted_round(
        prom,
        lambda: answers.update(answer(url, 4) for _ in range(FAILED_PD)),
        lambda: answer(url, 4),
    )
    failed: Counter[int] = Counter()
    for (status, _), n in answers.items():
        failed[int(status)] += n
    # The breakers open within the round: the requests after that are refused (503).
    assert set(failed) <= {500, 503} and failed[500] >= 1, failed
    assert_panel(
        prom,
        "pdstack-gateway",
        "Worker errors",
        "smg_worker_errors_total",
        window,
        "worker_type",
        {"prefill": failed[500], "decode": failed[500]},
    )
    # smg counts a response under its status and error code, and which leg's 500 it reports
    # (prefill_internal_error or decode_internal_error) is a race between the two legs: a
    # pair of labels first seen inside the window is a new series, whose first count rate()
    # cannot see, so the panel shows the answers whose series existed before the window.
    existed = {
        (r["metric"]["status_code"], r["metric"].get("error_code", "ok"))
        for r in prom.query("smg_http_responses_total", at=window[0])
    }
    shown_truth: Counter[str] = Counter()
    for (status, code), n in answers.items():
        shown_truth[status] += n if (status, code) in existed else 0
    print(f"Errors: answers {dict(answers)}, series before the window {sorted(existed)}")
    assert shown_truth["503"] + shown_truth["500"] >= 1, (answers, existed)
    assert_panel(
        prom,
        "pdstack-overview",
        "Errors",
        "smg_http_responses_total",
        window,
        "status_code",
        {status: n for status, n in shown_truth.items() if n},
    )
    truth = logged(stack.gateway, CB_TRANSITION) - transitions
    assert truth, "no breaker changed state"
    assert_panel(
        prom,
        "pdstack-gateway",
        "Breaker transitions",
        "smg_worker_cb_transitions_total",
        window,
        "worker",
        dict(truth),
    )
    # The breakers that smg last logged opening (it keeps them open) drive the alert.
    state = {m["worker"]: m["to"] for m in CB_TRANSITION.finditer(smg_log(stack.gateway))}
    for worker in [w for w, to in state.items() if to == "open"]:
        wait_until(
            lambda w=worker: prom.firing("PDGatewayCircuitOpen", worker=w), 30, "breaker open"
        )

    # The decode stopped: each failed probe is one line in smg's log; the gateway marks the
    # worker unhealthy.
    time.sleep(3)
    start, before = time.time(), logged(stack.gateway, PROBE_FAILED)[decode_url]
    stack.decode.stop()
    wait_until(
        lambda: prom.firing("PDGatewayWorkerUnhealthy", worker=decode_url),
        30,
        "PDGatewayWorkerUnhealthy",
    )
    stack.decode.start().wait_healthy()
    stack.gateway.wait_ready()
    end = prom.wait_window(start, PLANT_WINDOW_S)
    assert_panel(
        prom,
        "pdstack-gateway",
        "Failed health checks",
        "smg_worker_health_checks_total",
        (start, end),
        "worker_type",
        {"decode": logged(stack.gateway, PROBE_FAILED)[decode_url] - before},
    )
