"""`pdctl exporter` (also `python -m pdctl.exporter`): serve the pd-exporter metrics."""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

import click
from prometheus_client import CollectorRegistry, start_http_server

from pdctl import program, topology
from pdctl.errors import PdctlError
from pdctl.exporter.canary import Canary
from pdctl.exporter.collector import PdCollector
from pdctl.exporter.gpu import Nvml, load_nvml
from pdctl.exporter.graph_sizes import GraphSizes
from pdctl.exporter.statelog import StateLog
from pdctl.exporter.targets import TopologyFile

DEFAULT_PORT = 9840


def _journal_files(values: tuple[str, ...]) -> dict[str, Path]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(
                f"expected NAME=PATH, got {value!r}", param_hint="--journal-file"
            )
        out[name] = Path(path)
    return out


def _listen(address: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    try:
        server, _ = start_http_server(port, addr=address, registry=registry)
    except OSError as e:
        hint = {
            errno.EADDRINUSE: f"another process listens there (ss -ltnp 'sport = :{port}'); "
            "stop it or choose --port",
            errno.EADDRNOTAVAIL: "not an address of this host; give one of `ip -brief "
            "address` or 127.0.0.1 (--listen-address)",
            errno.EACCES: "ports below 1024 need privileges; choose --port",
        }.get(e.errno or 0, "check --listen-address and --port")
        why = e.strerror or str(e)  # socket.gaierror: an unknown host name
        raise PdctlError(f"cannot listen on {address}:{port}: {why}; {hint}") from None
    return server


@click.command("exporter")
@click.option(
    "--topology",
    "topology_path",
    type=click.Path(path_type=Path),
    default=topology.PATH,
    show_default=True,
    help="Topology file site.yml writes.",
)
@click.option(
    "--host",
    default=socket.gethostname,
    show_default="this host's name",
    help="Inventory name of this host in the topology.",
)
@click.option("--listen-address", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--canary-interval",
    default=15.0,
    show_default=True,
    type=float,
    help="Seconds between canary generates through each group.",
)
@click.option("--canary-timeout", default=10.0, show_default=True, type=float)
@click.option(
    "--journal-file",
    "journal_files",
    multiple=True,
    metavar="NAME=PATH",
    help="Read engine NAME's log from a file instead of its journal (replays, tests).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def exporter(
    topology_path: Path,
    host: str,
    listen_address: str,
    port: int,
    canary_interval: float,
    canary_timeout: float,
    journal_files: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve GPU, pair-canary and decode-journal metrics for Prometheus (pd-exporter)."""
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    journals = _journal_files(journal_files)
    # Bind first: a port in use or a foreign address fails before NVML, threads or probes.
    registry = CollectorRegistry(auto_describe=False)
    server = _listen(listen_address, port, registry)
    log = StateLog()
    nvml = Nvml(load_nvml(), log)
    canary = Canary(canary_interval, canary_timeout, log)
    collector = PdCollector(
        TopologyFile(topology_path),
        host,
        nvml,
        canary,
        GraphSizes(timeout_s=2.0),
        journals,
        log,
    )
    collector.refresh()
    registry.register(collector)
    canary.start()
    logging.getLogger("pdctl.exporter").info(
        "serving on %s:%d for host %s", listen_address, port, host
    )
    done = threading.Event()

    def _stop(signum: int, _: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    server.shutdown()
    canary.stop()
    collector.stop()
    nvml.stop()


def main() -> None:
    program.run(exporter, "pd-exporter")
