"""Wall time of `pdctl status` (collect) against a fleet whose every probe is slow: probes one
after another (PROBE_WORKERS=1) against all at once (the shipped bound); and, with --doctor,
of `pdctl doctor` as the fleet grows.

By default 4 pairs on 2 hosts (8 engines); --hosts H --per-host G for other sizes. Every
engine HTTP answer (/health, /metrics, /generate), every gateway answer and every systemd
call (`systemctl show`, a journal read, a process's argv, a marker file: ssh in a real fleet)
takes --delay seconds. The probes are real: pdctl's own HTTP probes, canaries and
GatewayAdmin against local servers; only systemd is a stand-in that sleeps. Expected:
sequential ~ the sum of all probes, concurrent ~ the slowest single probe (the gateway's:
readiness, canary, worker list) while the probes fit in one wave of the bound.

    .venv/bin/python benchmarks/status_fanout.py [--delay 0.5] [--runs 3]
    .venv/bin/python benchmarks/status_fanout.py --hosts 16 --per-host 2 --delay 0.1 --doctor
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pdctl.ops import doctor, status
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
    """systemd over ssh, every call as slow as the other probes."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def show(self, unit: str) -> UnitStatus:
        time.sleep(self.delay)
        return UnitStatus(unit, "loaded", "active", "running", 4242, time.time() - 60, 0, [])

    def read_file(self, path: str) -> str | None:
        time.sleep(self.delay)
        return None  # no restart-pending marker

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        time.sleep(self.delay)
        return []

    def cmdline(self, pid: int) -> list[str]:
        time.sleep(self.delay)
        return []


def fleet(
    delay: float, hosts: int = 2, per_host: int = 2
) -> tuple[Topology, str, list[ThreadingHTTPServer]]:
    engine = {"/health": b"", "/metrics": METRICS, "/generate": b'{"text": "x"}'}
    instances, pairs, servers, urls = [], [], [], []
    for host in (f"gpu-node-{17 + h:03d}" for h in range(hosts)):
        for n in range(per_host):
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
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2, help="pairs per host")
    ap.add_argument("--doctor", action="store_true", help="pdctl doctor too (bound only)")
    args = ap.parse_args()
    topo, gw_url, servers = fleet(args.delay, args.hosts, args.per_host)
    systemd = SlowSystemd(args.delay)
    ops = Ops(Source(topo, None), lambda _h: systemd, [GatewayAdmin(gw_url)])  # type: ignore[arg-type,return-value]
    n = len(topo.instances)
    print(f"{n} engines, {len(topo.pairs)} pairs, every probe answer {args.delay:g} s")
    shipped = status.PROBE_WORKERS
    # One probe after another takes minutes beyond a few pairs: only at the default size.
    sequential = [("sequential", 1)] if len(topo.pairs) <= 4 else []
    for label, workers in (*sequential, (f"concurrent (bound {shipped})", shipped)):
        status.PROBE_WORKERS = workers
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            s = status.collect(ops, 1)
            times.append(time.perf_counter() - t0)
            assert all(i.probe.healthy for i in s.instances), "a probe failed: no figure"
            assert all(p.canary.ok for p in s.pairs), "a canary failed: no figure"
        print(f"  {label:<26} median {statistics.median(times):6.2f} s  min {min(times):6.2f} s")
    if args.doctor:
        t0 = time.perf_counter()
        doctor.doctor(ops)
        print(f"  {'doctor (bound ' + str(shipped) + ')':<26} {time.perf_counter() - t0:6.2f} s")
    for server in servers:
        server.shutdown()


if __name__ == "__main__":
    main()
