"""The exporter's pair canary: every pair and group of this host probed in the background
through its PD paths (pdctl.pdclient.group_canary, the probe pdctl status uses too)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import requests

from pdctl.exporter.statelog import StateLog
from pdctl.pdclient import CanaryResult, group_canary


@dataclass(frozen=True)
class PairTarget:
    pair: str  # HOST/PAIR (or HOST/GROUP), the `pair` label everywhere
    # (prefill URL, decode URL, bootstrap port) per leg (pdclient.legs): a pair has one.
    legs: tuple[tuple[str, str, int], ...]


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
            result = group_canary(list(target.legs), timeout=self.timeout_s, session=self._session)
            # One line per failed canary, as pdstack_pair_canary_failures_total counts them.
            self.log.report(f"canary {target.pair}", result.error, every=True)
            with self._lock:
                self.results[target.pair] = result
                self.runs[target.pair] = self.runs.get(target.pair, 0) + 1
                if not result.ok:
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
