"""Unit-test helpers: profiles as dicts, written with an inventory to tmp_path and loaded."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl.spec import Deployment, load_deployment
from tests.conftest import Run, run_pdctl

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "deploy" / "profiles"

_SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in PROFILES.glob("*.yml")}


@pytest.fixture
def shipped() -> Callable[[str], dict[str, Any]]:
    """shipped("reference") -> a fresh copy of deploy/profiles/reference.yml to modify."""
    return lambda name: copy.deepcopy(_SHIPPED[name])


def inventory_text(
    hosts: list[str],
    router: str | None = None,
    profile: str = "profile.yml",
    etcd: str | None = None,
) -> str:
    """[etcd] defaults to the [router] hosts; `etcd=""` leaves the group empty."""
    router = router or hosts[0]
    lines = ["[pd_hosts]", *hosts, "", "[router]", router, ""]
    lines += ["[etcd]", *([router] if etcd is None else [etcd] if etcd else []), ""]
    return "\n".join([*lines, "[all:vars]", f"pdstack_profile={profile}", ""])


WriteDeployment = Callable[..., Path]


@pytest.fixture
def write_deployment(tmp_path: Path) -> WriteDeployment:
    """write(profile_dict_or_text, hosts=[...], router=None, etcd=None) -> the inventory path.

    The inventory names profile.yml next to it, so `pdctl validate -i <path>` finds both.
    """

    def write(
        profile: dict[str, Any] | str,
        hosts: list[str] | None = None,
        router: str | None = None,
        etcd: str | None = None,
    ) -> Path:
        text = profile if isinstance(profile, str) else yaml.safe_dump(profile, sort_keys=False)
        (tmp_path / "profile.yml").write_text(text)
        inventory = tmp_path / "inventory.ini"
        inventory.write_text(inventory_text(hosts or ["gpu-node-1"], router, etcd=etcd))
        return inventory

    return write


@pytest.fixture
def load(write_deployment: WriteDeployment) -> Callable[..., Deployment]:
    """load(profile_dict, hosts=..., router=...) -> the resolved Deployment."""

    def _load(profile: dict[str, Any], **kw: Any) -> Deployment:
        return load_deployment(write_deployment(profile, **kw))

    return _load


@pytest.fixture
def pdctl() -> Callable[..., Run]:
    """pdctl("validate", "-i", path): see tests.conftest.run_pdctl."""
    return run_pdctl


@dataclass(frozen=True)
class FakeHttp:
    url: str
    seen: list[tuple[str, str]]  # (method, path) of every request


@dataclass
class InFlight:
    """Requests being answered now across the fake servers that share it, and the most at once."""

    now: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.now += n
            self.peak = max(self.peak, self.now)


@pytest.fixture
def fake_http() -> Iterator[Callable[..., FakeHttp]]:
    """fake_http({"/health": (200, b"..."), ...}) -> a local HTTP server answering each path
    (any method) with that status and body; other paths get `*` or 404. For engines and
    gateways that answer what they should not (HTML, binary) without starting real ones.
    delay=S answers after S seconds; in_flight=InFlight() counts the requests in progress."""
    servers: list[ThreadingHTTPServer] = []

    def start(
        routes: dict[str, tuple[int, bytes]], delay: float = 0.0, in_flight: InFlight | None = None
    ) -> FakeHttp:
        seen: list[tuple[str, str]] = []
        gauge = in_flight or InFlight()

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                seen.append((self.command, path))
                gauge.add(1)
                time.sleep(delay)
                gauge.add(-1)
                status, body = routes.get(path) or routes.get("*") or (404, b"not found")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return FakeHttp(f"http://127.0.0.1:{server.server_port}", seen)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
