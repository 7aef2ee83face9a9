"""One log line per change of a source's state, not one per scrape: a broken NVML or an
unreachable engine must be visible in the journal without flooding it."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("pdctl.exporter")


class StateLog:
    def __init__(self) -> None:
        self._errors: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def report(self, source: str, error: str | None, every: bool = False) -> None:
        """`every`: log each error, not only a new one (for failures that are counted)."""
        with self._lock:
            previous = self._errors.get(source)
            self._errors[source] = error
        if error is not None and (every or error != previous):
            log.warning("%s: %s", source, error)
        elif error is None and previous is not None:
            log.info("%s: recovered", source)
