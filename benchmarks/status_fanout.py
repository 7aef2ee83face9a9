"""Wall time of `pdctl status` (collect) against a fleet whose every probe is slow: probes one
after another (PROBE_WORKERS=1) against all at once (the shipped bound).

4 pairs on 2 hosts (8 engines). Every engine HTTP answer (/health, /metrics, /generate), every
gateway answer and every `systemctl show` (ssh in a real fleet) takes --delay seconds. The
probes are real: pdctl's own HTTP probes, canaries and GatewayAdmin against local servers;
only systemd is a stand-in that sleeps. Expected: sequential ~ the sum of all probes,
concurrent ~ the slowest single probe (the gateway's: readiness, canary, worker list).

    .venv/bin/python benchmarks/status_fanout.py [--delay 0.5] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pdctl.ops import status
from pdctl.ops.context import Ops
from pdctl.ops.gateway import GatewayAdmin
from pdctl.ops.source import Source
from pdctl.ops.systemd import UnitStatus
from pdctl.topology import Topology

METRICS = b"""# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="sim"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="sim"} 0.1
"""


def serve(routes: dict[str, bytes], delay: float) -> tuple[str, ThreadingHTTPServer]:
    """A local server answering each path with 200 and its body after `delay` seconds."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(delay)
            body = routes.get(self.path.split("?")[0], b"")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", server


class SlowSystemd:
    """`systemctl show` over ssh, as slow as the other probes."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def show(self, unit: str) -> UnitStatus:
        time.sleep(self.delay)
        return UnitStatus(unit, "loaded", "active", "running", 4242, time.time() - 60, 0, [])


def fleet(delay: float) -> tuple[Topology, str, list[ThreadingHTTPServer]]:
    engine = {"/health": b"", "/metrics": METRICS, "/generate": b'{"text": "x"}'}
    instances, pairs, servers, urls = [], [], [], []
    for host in ("gpu-node-017", "gpu-node-018"):
        for n in range(2):
            ids = {}
            for role in ("prefill", "decode"):
                url, server = serve(engine, delay)
                servers.append(server)
                urls.append(url)
                ids[role] = f"{host}/pd{n}-{role}"
                instances.append(
                    {
                        "id": ids[role],
                        "host": host,
                        "name": f"pd{n}-{role}",
                        "pair": f"pd{n}",
                        "role": role,
                        "unit": f"pdstack-pd{n}-{role}.service",
                        "url": url,
                        "numa_node": n,
                        "gpus": [n],
                        "bootstrap_port": 8998 + n if role == "prefill" else None,
                    }
                )
            pairs.append({"host": host, "name": f"pd{n}", "target": f"pdstack-pd{n}.target", **ids})
    workers = [
        {"id": str(i), "url": u, "worker_type": "?", "status": "ready", "is_healthy": True}
        for i, u in enumerate(urls)
    ]
    gw_routes = {
        "/readiness": b'{"status":"ready"}',
        "/workers": json.dumps({"workers": workers}).encode(),
        "/generate": b'{"text": "x"}',
    }
    gw_url, gw_server = serve(gw_routes, delay)
    servers.append(gw_server)
    gateway = {"host": "gpu-node-017", "url": gw_url, "metrics_url": gw_url, "unit": "gw.service"}
    topo = {"model": "sim", "engine": "sim", "instances": instances, "pairs": pairs}
    return Topology.model_validate({**topo, "gateways": [gateway]}), gw_url, servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=0.5, help="seconds per probe answer")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    topo, gw_url, servers = fleet(args.delay)
    systemd = SlowSystemd(args.delay)
    ops = Ops(Source(topo, None), lambda _h: systemd, [GatewayAdmin(gw_url)])  # type: ignore[arg-type,return-value]
    n = len(topo.instances)
    print(f"{n} engines, {len(topo.pairs)} pairs, every probe answer {args.delay:g} s")
    shipped = status.PROBE_WORKERS
    for label, workers in (("sequential", 1), (f"concurrent (bound {shipped})", shipped)):
        status.PROBE_WORKERS = workers
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            s = status.collect(ops, 1)
            times.append(time.perf_counter() - t0)
            assert all(i.probe.healthy for i in s.instances), "a probe failed: no figure"
            assert all(p.canary.ok for p in s.pairs), "a canary failed: no figure"
        print(f"  {label:<26} median {statistics.median(times):6.2f} s  min {min(times):6.2f} s")
    for server in servers:
        server.shutdown()


if __name__ == "__main__":
    main()
