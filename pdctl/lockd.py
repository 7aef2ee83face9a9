"""The fleet restart lock: one lease, served on the first [router] host (`pdctl lock serve`).

Every restart (`pdctl restart`, `pdctl recover`, site.yml's handler through `pdctl restart`),
on any host or controller, holds the lease while it restarts (pdctl.ops.lock.fleet_held).

- POST /lease {host, pid, what, ttl_s}: granted with a token, or 409 with the holder. A lease
  not renewed within its ttl is stale: the acquire takes it over and the answer names the
  holder it replaced (`took_over`), so the client can warn; never silently.
- POST /lease/renew {token}, POST /lease/release {token}: the holder only (the token);
  anyone else gets 409 with the lease as it is.
- GET /lease: the lease (or null), for `pdctl status` and `pdctl doctor`.

Auth: with a key (the gateway's API key, PDSTACK_GATEWAY_API_KEY in the unit's environment),
POSTs need `Authorization: Bearer KEY`; GET is open, like the gateway's /readiness. Without a
key nothing is checked, the gateway's posture: bind it to a trusted network.

The lease is written to a file (atomically) on every change, so restarting the server does
not free a held lock; a lease read back gets a fresh ttl from the server's start, so its
holder's heartbeats, which failed while the server was down, do not make it stale at once.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from pdctl.ops.lock import AcquireRequest, LeaseAnswer, LeaseView, TokenRequest

log = logging.getLogger("pdctl.lockd")
M = TypeVar("M", bound=BaseModel)


class Lease(BaseModel):
    """The lease as stored (with the holder's token)."""

    host: str
    pid: int
    what: str
    since: float
    heartbeat: float
    ttl_s: float
    token: str

    def view(self, now: float) -> LeaseView:
        age = max(now - self.heartbeat, 0.0)
        return LeaseView(
            host=self.host,
            pid=self.pid,
            what=self.what,
            since=self.since,
            heartbeat=self.heartbeat,
            ttl_s=self.ttl_s,
            held_s=round(max(now - self.since, 0.0), 1),
            heartbeat_age_s=round(age, 1),
            stale=age > self.ttl_s,
        )


class Leases:
    """The one lease and its rules; persisted to `path` (None: in memory only)."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path, self.clock = path, clock
        self.lease = self._load()

    def _load(self) -> Lease | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            raw = self.path.read_bytes()
            lease = Lease.model_validate_json(raw) if raw else None
        except (OSError, ValidationError) as e:
            log.warning("lease file %s unreadable (%s): starting with the lock free", self.path, e)
            return None
        if lease is not None:
            # The holder could not renew while this server was down: give it a ttl from now.
            lease = lease.model_copy(update={"heartbeat": max(lease.heartbeat, self.clock())})
            log.info("holding over the lease of %s PID %s (%s)", lease.host, lease.pid, lease.what)
        return lease

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = self.lease.model_dump_json() if self.lease else ""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _view(self) -> LeaseView | None:
        return self.lease.view(self.clock()) if self.lease else None

    def state(self) -> LeaseAnswer:
        return LeaseAnswer(lease=self._view())

    def acquire(self, req: AcquireRequest) -> LeaseAnswer:
        now = self.clock()
        took_over = None
        if self.lease is not None:
            current = self.lease.view(now)
            if not current.stale:
                return LeaseAnswer(lease=current, granted=False)
            took_over = current
            log.warning(
                "taking over the stale lease of %s PID %s (%s): not renewed for %.0fs",
                current.host, current.pid, current.what, current.heartbeat_age_s,
            )  # fmt: skip
        self.lease = Lease(
            host=req.host,
            pid=req.pid,
            what=req.what,
            since=now,
            heartbeat=now,
            ttl_s=req.ttl_s,
            token=secrets.token_urlsafe(24),
        )
        self._save()
        log.info("granted to %s PID %s: %s", req.host, req.pid, req.what)
        return LeaseAnswer(
            lease=self._view(), granted=True, token=self.lease.token, took_over=took_over
        )

    def _ours(self, token: str) -> bool:
        return self.lease is not None and hmac.compare_digest(self.lease.token, token)

    def renew(self, token: str) -> LeaseAnswer:
        if self.lease is None or not self._ours(token):
            return LeaseAnswer(lease=self._view(), granted=False)
        self.lease = self.lease.model_copy(update={"heartbeat": self.clock()})
        self._save()
        return LeaseAnswer(lease=self._view(), granted=True)

    def release(self, token: str) -> LeaseAnswer:
        if self.lease is None or not self._ours(token):
            return LeaseAnswer(lease=self._view(), granted=False)
        log.info("released by %s PID %s", self.lease.host, self.lease.pid)
        self.lease = None
        self._save()
        return LeaseAnswer(granted=True)


def _answer(ans: LeaseAnswer) -> web.Response:
    status = 409 if ans.granted is False else 200
    return web.json_response(text=ans.model_dump_json(), status=status)


def app(leases: Leases, api_key: str | None) -> web.Application:
    async def body(request: web.Request, model: type[M]) -> M:
        if api_key:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise web.HTTPUnauthorized(text="needs Authorization: Bearer <the gateway's key>")
        try:
            return model.model_validate(json.loads(await request.read()))
        except (ValueError, ValidationError) as e:
            raise web.HTTPBadRequest(text=f"bad request: {e}") from None

    async def get(_: web.Request) -> web.Response:
        return _answer(leases.state())

    async def acquire(request: web.Request) -> web.Response:
        req = await body(request, AcquireRequest)
        return _answer(leases.acquire(req))

    async def renew(request: web.Request) -> web.Response:
        req = await body(request, TokenRequest)
        return _answer(leases.renew(req.token))

    async def release(request: web.Request) -> web.Response:
        req = await body(request, TokenRequest)
        return _answer(leases.release(req.token))

    a = web.Application(client_max_size=64 << 10)
    a.router.add_get("/lease", get)
    a.router.add_post("/lease", acquire)
    a.router.add_post("/lease/renew", renew)
    a.router.add_post("/lease/release", release)
    return a


def serve(host: str, port: int, state: Path | None, api_key: str | None) -> None:
    """Run until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    leases = Leases(state)
    auth = "bearer key" if api_key else "no key (no authentication)"
    log.info("fleet restart lock on %s:%s, state %s, %s", host, port, state or "in memory", auth)
    web.run_app(app(leases, api_key), host=host, port=port, print=None, access_log=None)
