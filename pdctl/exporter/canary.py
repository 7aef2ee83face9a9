"""The pair canary: a one-token generate through one pair's PD path, sent the way the
gateway sends it — the same body to the prefill and the decode at once, with the prefill's
bootstrap host/port and a random room. It is pinned to the pair (a request to the gateway
could land on any pair) and fails exactly when bootstrap or KV transfer is broken, which
each engine's own /health never notices."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from pdctl.exporter.statelog import StateLog


@dataclass(frozen=True)
class PairTarget:
    pair: str  # HOST/PAIR, the `pair` label everywhere
    prefill_url: str
    decode_url: str
    bootstrap_port: int


@dataclass(frozen=True)
class CanaryResult:
    success: bool
    duration_s: float
    finished_at: float
    error: str | None = None


def _has_text(body: object) -> bool:
    return isinstance(body, dict) and "text" in body


def probe(target: PairTarget, timeout_s: float, session: requests.Session) -> CanaryResult:
    body = {
        "text": "ping",
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "bootstrap_host": urlsplit(target.prefill_url).hostname,
        "bootstrap_port": target.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    start = time.monotonic()
    error: str | None = None
    with ThreadPoolExecutor(max_workers=2) as pool:
        legs = {
            role: pool.submit(session.post, f"{url}/generate", json=body, timeout=timeout_s)
            for role, url in (("prefill", target.prefill_url), ("decode", target.decode_url))
        }
        for role, leg in legs.items():
            try:
                response = leg.result()
                if response.status_code != 200:
                    error = error or f"{role} answered HTTP {response.status_code}"
                elif role == "decode" and not _has_text(response.json()):
                    error = error or "decode answered without generated text"
            except (requests.RequestException, ValueError) as e:
                error = error or f"{role}: {type(e).__name__}: {e}"
    return CanaryResult(error is None, time.monotonic() - start, time.time(), error)


class Canary:
    """Probes every pair of this host in a background thread; scrapes read the last result,
    so a hung pair costs the scrape nothing."""

    def __init__(self, interval_s: float, timeout_s: float, log: StateLog) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.log = log
        self.targets: list[PairTarget] = []
        self.results: dict[str, CanaryResult] = {}
        self.runs: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._session = requests.Session()
        self._thread: threading.Thread | None = None

    def set_targets(self, targets: list[PairTarget]) -> None:
        with self._lock:
            self.targets = list(targets)

    def run_once(self) -> None:
        with self._lock:
            targets = list(self.targets)
        for target in targets:
            result = probe(target, self.timeout_s, self._session)
            self.log.report(f"canary {target.pair}", result.error)
            with self._lock:
                self.results[target.pair] = result
                self.runs[target.pair] = self.runs.get(target.pair, 0) + 1
                if not result.success:
                    self.failures[target.pair] = self.failures.get(target.pair, 0) + 1

    def snapshot(self) -> tuple[dict[str, CanaryResult], dict[str, int], dict[str, int]]:
        with self._lock:
            current = {t.pair for t in self.targets}
            keep = {p: r for p, r in self.results.items() if p in current}
            return keep, dict(self.runs), dict(self.failures)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pair-canary", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 2)
