"""Health and load of every engine, probed concurrently with timeouts so one dead host never
stalls the others; the canaries that prove a pair serves. Ops reach both through the
Protocols below (the real ones over HTTP; tests hand in fakes, as they do for Systemd)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import requests

from pdctl import pdclient
from pdctl.pdclient import CanaryResult

T = TypeVar("T")
K = TypeVar("K")

PAUSED = "paused"  # EngineProbe.health of an engine whose generation is paused


@dataclass(frozen=True)
class EngineProbe:
    url: str
    # Whether it takes new work: "ok", "paused" (/pause_generation), an HTTP status (starting,
    # shutting down, a failed health check), or why it could not be reached.
    health: str
    running: float | None = None
    queued: float | None = None
    token_usage: float | None = None  # KV pool usage 0..1
    cuda_graph: bool | None = None  # last batch ran in a CUDA graph
    gen_throughput: float | None = None
    metrics_error: str | None = None  # /metrics answered but could not be read
    # What `health` read: /ready, or /health on an SGLang older than 0.5.20 (no /ready).
    ready_path: str = "/ready"

    @property
    def healthy(self) -> bool:
        return self.health == "ok"

    @property
    def paused(self) -> bool:
        return self.health == PAUSED


def _gauges(text: str) -> dict[str, list[float]]:
    # Here, not at import: `pdctl recover`, whose start-up counts towards a crash's time to
    # serving again, never parses /metrics.
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s.value)
    return out


def _answer(status: int) -> str:
    return "ok" if status == 200 else f"HTTP {status}"


def readiness(url: str, timeout: float = 3.0) -> tuple[str, str]:
    """(answer, the path that gave it). SGLang 0.5.20+'s /ready is 200 only while the engine
    takes new work: not starting, shutting down, failed its last /health, or paused; all are
    flag checks (http_server.ready). /ping (is_healthy, the same flags but the pause) tells a
    paused engine from the others. An older SGLang answers /ready 404: its /health (503 while
    starting or shutting down, else a 1-token generate) is then all there is, and a pause
    there shows as a /health that does not answer in time."""
    r = requests.get(f"{url}/ready", timeout=timeout)
    if r.status_code == 404:
        return _answer(requests.get(f"{url}/health", timeout=timeout).status_code), "/health"
    if r.status_code == 503 and requests.get(f"{url}/ping", timeout=timeout).status_code == 200:
        return PAUSED, "/ready"
    return _answer(r.status_code), "/ready"


def ready_probe(url: str, timeout: float = 3.0) -> EngineProbe:
    """The engine's readiness alone (`readiness`), without its /metrics: what a restart's
    health wait polls."""
    try:
        health, path = readiness(url, timeout)
    except requests.RequestException as e:
        return EngineProbe(url, f"unreachable ({type(e).__name__})")
    return EngineProbe(url, health, ready_path=path)


def probe_engine(url: str, timeout: float = 3.0) -> EngineProbe:
    try:
        health, path = readiness(url, timeout)
        m = requests.get(f"{url}/metrics", timeout=timeout)
    except requests.RequestException as e:
        return EngineProbe(url, f"unreachable ({type(e).__name__})")
    if m.status_code != 200:
        error = f"/metrics answered HTTP {m.status_code}"
        return EngineProbe(url, health, metrics_error=error, ready_path=path)
    try:
        g = _gauges(m.text)
    except ValueError as e:  # not the Prometheus text format (a proxy's page, a wrong port)
        error = f"/metrics is not Prometheus text: {e}"
        return EngineProbe(url, health, metrics_error=error, ready_path=path)

    def total(name: str) -> float | None:
        v = g.get(f"sglang:{name}")
        return sum(v) if v else None

    usage = g.get("sglang:token_usage")
    graph = g.get("sglang:is_cuda_graph")
    return EngineProbe(
        url,
        health,
        running=total("num_running_reqs"),
        queued=total("num_queue_reqs"),
        token_usage=max(usage) if usage else None,
        cuda_graph=bool(min(graph)) if graph else None,
        gen_throughput=total("gen_throughput"),
        ready_path=path,
    )


def in_flight(url: str, timeout: float = 3.0) -> int | None:
    """Requests the engine holds: running plus waiting, which in SGLang's LoadInquirer counts the
    disaggregation queues too (a prefill's bootstrap queue; a decode's prealloc and transfer
    queues), so a pair whose engines both say 0 has nothing in flight. smg's own `load` misses
    streamed requests (docs/restart.md, "drain"). None: the engine did not answer."""
    try:
        r = requests.get(f"{url}/v1/loads", params={"include": "core"}, timeout=timeout)
        r.raise_for_status()
        return sum(
            int(x["num_running_reqs"]) + int(x["num_waiting_reqs"]) for x in r.json()["loads"]
        )
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None


# SGLang's /pause_generation in mode abort returns once every request it held has ended; a
# prefill's wait on a dead decode ends at the abort.
ABORT_TIMEOUT_S = 5.0


def abort_all(url: str, timeout: float = ABORT_TIMEOUT_S) -> bool:
    """End every request the engine holds (`POST /pause_generation`, mode abort: SGLang's
    http_server.pause_generation, tokenizer_manager.pause_generation), so that its stop waits
    for none; the engine takes no new work until it stops. False: it did not answer."""
    try:
        r = requests.post(f"{url}/pause_generation", json={"mode": "abort"}, timeout=timeout)
    except requests.RequestException:
        return False
    return r.status_code == 200


class Engines(Protocol):
    def probe(self, url: str) -> EngineProbe: ...
    def ready(self, url: str) -> EngineProbe: ...
    def in_flight(self, url: str) -> int | None: ...
    def abort_all(self, url: str) -> bool: ...


class HttpEngines:
    """The engines' own HTTP endpoints (/ready, /ping or /health, /metrics, /v1/loads)."""

    def probe(self, url: str) -> EngineProbe:
        return probe_engine(url)

    def ready(self, url: str) -> EngineProbe:
        return ready_probe(url)

    def in_flight(self, url: str) -> int | None:
        return in_flight(url)

    def abort_all(self, url: str) -> bool:
        return abort_all(url)


# A canary leg: (prefill URL, decode URL, the prefill's bootstrap port).
Leg = tuple[str, str, int]


class Canaries(Protocol):
    """Requests down a pair's or group's own PD path (pdctl.pdclient), never the gateway's."""

    def pair(
        self, prefill: str, decode: str, bootstrap_port: int, count: int, timeout: float
    ) -> CanaryResult: ...
    def group(self, legs: list[Leg], count: int) -> CanaryResult: ...


class HttpCanaries:
    def pair(
        self, prefill: str, decode: str, bootstrap_port: int, count: int, timeout: float
    ) -> CanaryResult:
        return pdclient.pair_canary(prefill, decode, bootstrap_port, count, timeout)

    def group(self, legs: list[Leg], count: int) -> CanaryResult:
        return pdclient.group_canary(legs, count)


def concurrently(calls: dict[K, Callable[[], T]], workers: int = 16) -> dict[K, T]:
    """Run the calls in threads; each call bounds its own time (HTTP and ssh timeouts)."""
    if not calls:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(calls))) as pool:
        futures = {k: pool.submit(f) for k, f in calls.items()}
        return {k: f.result() for k, f in futures.items()}
