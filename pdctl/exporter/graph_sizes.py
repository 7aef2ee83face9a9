"""The largest decode batch each decode engine captured as a CUDA graph, from /server_info
(sglang 0.5.23: cuda_graph_bs_decode, cuda_graph_max_bs_decode). Running more requests than
this runs eager; the eager-fallback alert compares the two."""

from __future__ import annotations

import time

import requests

CACHE_S = 300.0  # graph sizes change only with a restart


def largest_graph(server_info: dict[str, object]) -> int | None:
    buckets = server_info.get("cuda_graph_bs_decode")
    if isinstance(buckets, list) and buckets:
        return max(int(b) for b in buckets)
    for key in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        value = server_info.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


class GraphSizes:
    def __init__(self, timeout_s: float, session: requests.Session | None = None) -> None:
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self._cache: dict[str, tuple[float, int | None]] = {}

    def get(self, url: str) -> int | None:
        """Raises requests.RequestException or ValueError when the engine cannot say."""
        cached = self._cache.get(url)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            return cached[1]
        response = self.session.get(f"{url}/server_info", timeout=self.timeout_s)
        response.raise_for_status()
        size = largest_graph(response.json())
        self._cache[url] = (time.monotonic(), size)
        return size
