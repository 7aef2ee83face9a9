"""The gateway's (smg) admin API: its workers, readiness, and taking a pair out and back in.

smg 1.13: `DELETE /workers/{id}` answers 202 and marks the worker `draining` (no new
requests; `load` counts the ones still in flight, but not streamed ones: those only the
engines count, pdctl.ops.health.in_flight), then removes it a few seconds later.
`POST /workers` answers 202 at once and a background job adds the worker when its engine
answers (up to smg's --worker-startup-timeout-secs, 30 min): GET /workers lists it only then.
`POST /workers` with an URL it holds or is still adding answers 409: taken as "already
registered". In PD mode smg picks prefill and decode separately; `pairing_protocol` on
`POST /workers` restricts a prefill to decodes with the same protocol (docs/gateway.md,
"Groups stay groups").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import requests
from pydantic import BaseModel, ValidationError

from pdctl import names
from pdctl.errors import PdctlError
from pdctl.ops.health import concurrently
from pdctl.pdclient import CanaryResult, gateway_canary

# Written by the pdstack_gateway role on [router] hosts, and by pdstack_engine on pd hosts.
KEY_FILES = (Path(names.GATEWAY_ENV_FILE), Path(names.OPS_ENV_FILE))
KEY_VAR = names.GATEWAY_KEY_VAR


class GatewayError(PdctlError):
    pass


class GatewayUnreachable(GatewayError):
    """No answer at all (refused, timed out): the gateway or its host may be gone."""


def api_key() -> str | None:
    """The gateway's API key (the fleet lock's too): from the environment, else the first
    env file of KEY_FILES that this user can read and that holds it."""
    if os.environ.get(KEY_VAR):
        return os.environ[KEY_VAR]
    for path in KEY_FILES:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith(f"{KEY_VAR}="):
                return line.split("=", 1)[1].strip()
    return None


class _Worker(BaseModel):
    """One entry of smg's GET /workers (fields pdctl reads; smg sends more)."""

    id: str
    url: str
    worker_type: str = "?"
    status: str = "?"
    is_healthy: bool = False
    load: int | None = 0
    pairing_protocol: str | None = None


class _Workers(BaseModel):
    workers: list[_Worker] = []


@dataclass(frozen=True)
class GatewayWorker:
    id: str
    url: str
    type: str  # prefill | decode
    status: str  # ready | draining | ...
    healthy: bool
    load: int  # in-flight requests the gateway has open on it
    pairing: str | None = None  # pairing protocol; pdctl registers a pair's workers with its id


@dataclass(frozen=True)
class Registration:
    """One worker as pdctl registers it: bound to its pair by pairing protocol."""

    url: str
    worker_type: str  # prefill | decode
    bootstrap_port: int | None
    pairing: str  # the pair's id
    running_window: int | None = None  # the engine's max_running_requests, where set


class Gateway(Protocol):
    """One gateway as ops drive it (GatewayAdmin over smg's admin API; tests hand in fakes,
    as they do for Systemd)."""

    url: str

    def workers(self) -> list[GatewayWorker]: ...
    def readiness(self) -> tuple[bool, str]: ...
    def reachable(self, connect_s: float) -> bool: ...
    def canary(self) -> CanaryResult: ...
    def remove(self, urls: Iterable[str]) -> None: ...
    def register(self, regs: Iterable[Registration], prune: bool = False) -> dict[str, str]: ...
    def wait_answering(self, timeout: float, step: float = 0.25) -> None: ...
    def wait(
        self, pred: Callable[[list[GatewayWorker]], bool], timeout: float, step: float = 0.25
    ) -> bool: ...


class GatewayAdmin:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 5.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        # With --api-key, smg wants it on /workers and on requests (not on /readiness).
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _call(self, method: str, path: str, **kw: Any) -> requests.Response:
        try:
            r = requests.request(
                method, f"{self.url}{path}", timeout=self.timeout, headers=self.headers, **kw
            )
        except requests.RequestException as e:
            raise GatewayUnreachable(f"gateway {self.url}: {type(e).__name__}: {e}") from None
        if r.status_code == 401:
            raise GatewayError(
                f"gateway {self.url}: {method} {path} needs the API key: set "
                f"{KEY_VAR} (root reads it from {' or '.join(map(str, KEY_FILES))})"
            )
        return r

    def workers(self) -> list[GatewayWorker]:
        r = self._call("GET", "/workers")
        if r.status_code != 200:
            raise GatewayError(f"gateway {self.url}: GET /workers answered {r.status_code}")
        try:
            listing = _Workers.model_validate(r.json())
        except (ValueError, ValidationError) as e:  # not JSON, or not smg's shape
            if isinstance(e, ValidationError):
                first = e.errors()[0]
                why = f"{'.'.join(str(p) for p in first['loc']) or 'body'}: {first['msg']}"
            else:
                why = f"not JSON: {r.text[:80]!r}"
            raise GatewayError(
                f"gateway {self.url}: GET /workers answered 200 but not smg's worker list "
                f"({why}): is {self.url} the smg gateway?"
            ) from None
        return [
            GatewayWorker(
                w.id,
                w.url,
                w.worker_type,
                w.status,
                w.is_healthy,
                w.load or 0,
                w.pairing_protocol,
            )
            for w in listing.workers
        ]

    def readiness(self) -> tuple[bool, str]:
        r = self._call("GET", "/readiness")
        return r.status_code == 200, r.text.strip()[:200]

    def reachable(self, connect_s: float) -> bool:
        """Whether anything answers at the gateway's address, given `connect_s` to connect: a
        listener that then answers slowly, or with an error, is there all the same."""
        try:
            requests.get(f"{self.url}/readiness", timeout=(connect_s, self.timeout))
        except requests.ConnectionError:  # refused, no route, connect timeout
            return False
        except requests.RequestException:  # connected: it is there
            return True
        return True

    def canary(self) -> CanaryResult:
        """One request through the gateway, to whichever pair it picks."""
        return gateway_canary(self.url, self.headers)

    def remove(self, urls: Iterable[str]) -> None:
        """DELETE the workers at once: while one side of a pair is still routable alone, smg
        combines it with another pair's worker (it does not know pairs).

        A worker smg is draining already is left alone: a second DELETE starts a second
        removal, which takes out by URL whatever is registered there when its drain window
        ends, i.e. the pair a restart has just registered again."""
        wanted = set(urls)
        ids = {w.id: w.url for w in self.workers() if w.url in wanted and w.status != "draining"}
        answers = concurrently({i: partial(self._call, "DELETE", f"/workers/{i}") for i in ids})
        for i, r in answers.items():
            if r.status_code not in (200, 202, 404):
                raise GatewayError(
                    f"gateway: DELETE /workers/{i} ({ids[i]}) answered "
                    f"{r.status_code}: {r.text[:200]}"
                )

    def add(
        self,
        url: str,
        worker_type: str,
        bootstrap_port: int | None = None,
        pairing: str | None = None,
        running_window: int | None = None,
    ) -> None:
        """Register a worker. `pairing` is smg's `pairing_protocol`: a prefill is only
        combined with decodes that carry the same one (an unlabelled worker still combines
        with any), so a pair's id keeps its requests inside the pair. `running_window` is
        the engine's max_running_requests, sent as smg's `max_running_requests` label: smg's
        PD admission bounds dispatch to a decode by that label and is off for a decode
        without one (it warns "PD admission is off for this decode worker", as it did against a
        real SGLang 0.5.17 decode): sent from the profile, the bound does not depend on what
        the engine's /server_info reports."""
        body: dict[str, Any] = {"url": url, "worker_type": worker_type}
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        if pairing is not None:
            body["pairing_protocol"] = pairing
        if running_window is not None:
            body["labels"] = {"max_running_requests": str(running_window)}
        r = self._call("POST", "/workers", json=body)
        if r.status_code not in (200, 201, 202, 409):
            raise GatewayError(
                f"gateway: POST /workers {url} answered {r.status_code}: {r.text[:200]}"
            )

    def register(self, regs: Iterable[Registration], prune: bool = False) -> dict[str, str]:
        """Add the workers the gateway does not hold, bound (idempotent: a worker it holds is
        left alone). Does not wait for the engines: smg adds each one once it answers.
        Returns per URL: added, bound (already, with its pairing), draining (being taken out:
        a restart is under way), or `unbound (pairing X)` (held without its pair's protocol:
        only `pdctl restart --both` rebinds it without failing its requests).

        With `prune`, `regs` are every instance of the topology: a worker held at a URL that
        matches none of them (its pair left the profile) is removed first and reported
        `removed`; one being drained already is left to smg."""
        regs = list(regs)
        held = {w.url: w for w in self.workers()}
        out: dict[str, str] = {}
        if prune:
            known = {r.url for r in regs}
            stale = [u for u, w in held.items() if u not in known and w.status != "draining"]
            if stale:
                self.remove(stale)
            out |= dict.fromkeys(stale, "removed")
        todo: list[Registration] = []
        for r in regs:
            w = held.get(r.url)
            if w is None:
                out[r.url] = "added"
                todo.append(r)
            elif w.status == "draining":
                out[r.url] = "draining"
            elif w.pairing == r.pairing:
                out[r.url] = "bound"
            else:
                out[r.url] = f"unbound (pairing {w.pairing or 'none'})"
        # At once, for the reason `remove` gives.
        concurrently(
            {
                r.url: partial(
                    self.add, r.url, r.worker_type, r.bootstrap_port, r.pairing, r.running_window
                )
                for r in todo
            }
        )
        return out

    def wait_answering(self, timeout: float, step: float = 0.25) -> None:
        """Wait until GET /workers answers (a gateway that is starting); GatewayError after
        `timeout` with the last error."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.workers()
                return
            except GatewayError as e:
                if time.monotonic() >= deadline:
                    raise GatewayError(f"{e} (still, after {timeout:.0f}s)") from None
            time.sleep(step)

    def wait(
        self, pred: Callable[[list[GatewayWorker]], bool], timeout: float, step: float = 0.25
    ) -> bool:
        """Poll /workers until `pred` holds; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if pred(self.workers()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(step)


def drained(urls: Iterable[str]) -> Callable[[list[GatewayWorker]], bool]:
    """Removed, or draining with nothing in flight (smg takes ~5 s more to remove an idle
    worker; waiting for that would only lengthen every rolling restart)."""
    wanted = set(urls)
    return lambda ws: all(w.status == "draining" and w.load == 0 for w in ws if w.url in wanted)


def settled(urls: Iterable[str], pairing: str) -> Callable[[list[GatewayWorker]], bool]:
    """Each worker gone (a drain's removal done: smg answers 409 until then) or held bound to
    `pairing` and not draining (added back already, e.g. by a gateway restart's register)."""
    wanted = set(urls)
    return lambda ws: all(
        w.pairing == pairing and w.status != "draining" for w in ws if w.url in wanted
    )


def ready(urls: Iterable[str]) -> Callable[[list[GatewayWorker]], bool]:
    wanted = set(urls)
    return lambda ws: wanted <= {w.url for w in ws if w.healthy and w.status == "ready"}
