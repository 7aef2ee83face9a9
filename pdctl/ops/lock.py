"""One restart at a time: per host an flock, across the fleet a lease (pdctl.lockd).

The host lock is an flock on /run/pdstack/restart.lock. flock dies with its holder, so a
crashed pdctl never leaves a stale lock behind; the file holds the holder's PID only so the
refusal can name it. Opened with O_NOFOLLOW: root must not truncate whatever a link planted at
the lock's name points to.

The fleet lock is a lease on the lock server of the first [router] host (the topology's
`lock`): taken after the host lock, renewed by a heartbeat thread every ttl/3, released at
the end. A holder that stops renewing for ttl (killed, its host lost) is taken over by the
next restarter, which says whom it took over from.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from pydantic import BaseModel, Field, ValidationError

from pdctl import names
from pdctl.errors import PdctlError

DEFAULT_PATH = Path(names.RESTART_LOCK)
PROGRESS_EVERY_S = 10.0


def default_path() -> Path:
    return Path(os.environ.get("PDCTL_LOCK", DEFAULT_PATH))


class LockHeld(PdctlError):
    exit_code = 3


class FleetLockUnavailable(PdctlError):
    """The fleet lock server did not answer (or refused the key): no restart without it."""

    exit_code = 5


def _never_lost() -> str | None:
    return None


@dataclass(frozen=True)
class Acquired:
    waited_s: float = 0.0
    behind: str | None = None  # the holder waited for ("PID 4242 pdctl restart ..."), if any
    took_over: str | None = None  # the dead fleet lock holder taken over, if any
    # Why the fleet lock may no longer be this restart's (taken over, or not renewed for
    # longer than its ttl), None while it is: a roll stops before its next pair.
    lost: Callable[[], str | None] = _never_lost


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PdctlError(
                f"{path} is a symbolic link; refusing to lock through it (remove it)"
            ) from None
        raise PdctlError(f"cannot open the restart lock {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PdctlError(f"{path} is not a regular file; refusing to use it as the restart lock")
    return fd


def _holder(fd: int) -> str:
    return os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process (root's restart, seen by a user)
        pass
    return True


@dataclass(frozen=True)
class Holder:
    pid: int | None
    what: str  # the command that holds it ("pdctl restart --both --pair pd0")
    since: float  # when it took the lock (time.time(), this machine's clock)
    host: str | None = None  # the fleet lock's holder's host; None: the host lock
    heartbeat_age_s: float | None = None  # fleet lock: since its last renewal
    ttl_s: float | None = None  # fleet lock: stale once heartbeat_age_s exceeds it

    @property
    def stale(self) -> bool:
        """A fleet lock holder that stopped renewing: the next restarter takes it over."""
        return self.ttl_s is not None and (self.heartbeat_age_s or 0.0) > self.ttl_s

    def describe(self) -> str:
        """In one line: pdf1 PID 4242 pdctl restart --both --pair pd0, since 12:01:05."""
        who = f"{self.host} PID {self.pid}" if self.host else f"PID {self.pid}"
        return f"{who} {self.what}, since {time.strftime('%H:%M:%S', time.localtime(self.since))}"


def holder(path: Path | None = None) -> Holder | None:
    """Who holds the lock now, or None, read without taking it (for `pdctl status`).

    The holder writes its line when it takes the lock, so the file's mtime is its start. A
    line left by a holder killed with SIGKILL is not a holder: the flock test below tells."""
    path = path or default_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PdctlError(f"cannot read the restart lock {path}: {e.strerror}") from None
    try:
        line = os.pread(fd, 512, 0).decode(errors="replace").strip()
        pid, _, what = line.partition(" ")
        if not line or (pid.isdigit() and not _alive(int(pid))):
            return None
        try:  # a shared lock is refused only while a holder has it exclusively
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            return Holder(int(pid) if pid.isdigit() else None, what, os.fstat(fd).st_mtime)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _host_held(
    what: str, path: Path | None, wait: float, say: Callable[[str], None] | None, poll: float
) -> Iterator[Acquired]:
    path = path or default_path()
    fd = _open(path)
    try:
        t0, last = time.monotonic(), None  # last: when progress was last said
        behind = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now, behind = time.monotonic(), _holder(fd)
                if now - t0 >= wait:
                    waited = f" after waiting {wait:g}s" if wait else ""
                    raise LockHeld(
                        f"another restart is running: PID {behind} holds {path}{waited}; "
                        "wait for it to finish (or check that PID)"
                    ) from None
                if say is not None and (last is None or now - last >= PROGRESS_EVERY_S):
                    last = now
                    say(
                        f"waiting for the restart lock: PID {behind} holds {path} "
                        f"[{now - t0:.0f}s of {wait:g}s]"
                    )
                time.sleep(min(poll, max(wait - (now - t0), 0.0)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        try:
            waited_s = round(time.monotonic() - t0, 1) if behind else 0.0
            yield Acquired(waited_s, f"PID {behind}" if behind else None)
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


# ----- the fleet lock: a lease on the lock server (pdctl.lockd) ------------------------------
class LeaseView(BaseModel):
    """A lease as the lock server shows it (never its token). Times are the server's."""

    host: str
    pid: int
    what: str
    since: float
    heartbeat: float
    ttl_s: float
    held_s: float
    heartbeat_age_s: float
    stale: bool

    def holder(self) -> Holder:
        """In this machine's clock: `since` from the server's own held_s, so clock skew
        between hosts does not shift it."""
        return Holder(
            self.pid,
            self.what,
            time.time() - self.held_s,
            self.host,
            self.heartbeat_age_s,
            self.ttl_s,
        )


class LeaseAnswer(BaseModel):
    """Every answer of the lock server: the lease (None: free), and to an acquire whether it
    was granted, the holder's token, and the stale lease it took over."""

    lease: LeaseView | None = None
    granted: bool | None = None
    token: str | None = None
    took_over: LeaseView | None = None


WHAT_MAX = 2000  # characters of the holder's command line the server keeps


class AcquireRequest(BaseModel):
    host: str = Field(min_length=1, max_length=255)
    pid: int = Field(ge=1)
    what: str = Field(max_length=WHAT_MAX)
    ttl_s: float = Field(ge=1, le=3600)


class TokenRequest(BaseModel):
    token: str = Field(min_length=1, max_length=128)


@dataclass(frozen=True)
class Grant:
    token: str
    took_over: Holder | None  # the stale holder this acquire replaced


class FleetLock:
    """The client of the lock server at `url` (the topology's `lock`)."""

    def __init__(self, url: str, api_key: str | None, ttl_s: float, timeout: float = 5.0) -> None:
        self.url, self.ttl_s = url.rstrip("/"), ttl_s
        self.timeout = min(timeout, ttl_s / 3)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> LeaseAnswer:
        where = f"the fleet restart lock at {self.url}"
        try:
            r = requests.request(
                method, f"{self.url}{path}", json=body, headers=self.headers, timeout=self.timeout
            )
        except requests.RequestException as e:
            raise FleetLockUnavailable(f"{where} does not answer ({type(e).__name__})") from None
        if r.status_code == 401:
            raise FleetLockUnavailable(
                f"{where} needs the gateway's API key: set {names.GATEWAY_KEY_VAR} (root reads "
                f"it from {names.OPS_ENV_FILE} or {names.GATEWAY_ENV_FILE})"
            )
        if r.status_code not in (200, 409):
            raise FleetLockUnavailable(f"{where} answered {r.status_code}: {r.text[:200]}")
        try:
            return LeaseAnswer.model_validate_json(r.content)
        except ValidationError:
            raise FleetLockUnavailable(
                f"{where} answered {r.status_code} but not a lock server's answer "
                f"({r.text[:80]!r}): is it pdctl lock serve?"
            ) from None

    def holder(self) -> Holder | None:
        lease = self._call("GET", "/lease").lease
        return lease.holder() if lease else None

    def acquire(self, what: str) -> Grant | Holder:
        """The lease (a Grant), or who holds it."""
        if len(what) > WHAT_MAX:  # a roll of very many pairs: its start says what it is
            what = what[: WHAT_MAX - 1] + "…"
        body = AcquireRequest(
            host=socket.gethostname(), pid=os.getpid(), what=what, ttl_s=self.ttl_s
        )
        ans = self._call("POST", "/lease", body.model_dump())
        if ans.granted and ans.token:
            return Grant(ans.token, ans.took_over.holder() if ans.took_over else None)
        if ans.lease is None:  # a refusal names the holder; this is no lock server's answer
            raise FleetLockUnavailable(
                f"the fleet restart lock at {self.url} refused, naming no holder"
            )
        return ans.lease.holder()

    def renew(self, token: str) -> tuple[bool, Holder | None]:
        """(True, _) while the lease is ours; else (False, who holds it now, None: nobody)."""
        ans = self._call("POST", "/lease/renew", {"token": token})
        return bool(ans.granted), ans.lease.holder() if ans.lease else None

    def release(self, token: str) -> None:
        self._call("POST", "/lease/release", {"token": token})


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Heartbeat:
    """Renews the lease every ttl/3 until stopped; says loudly when renewing fails for longer
    than the ttl (another restarter may take the lease over) or the lease was taken."""

    def __init__(self, fleet: FleetLock, token: str, say: Callable[[str], None]) -> None:
        self.fleet, self.token, self.say = fleet, token, say
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleet-lock-heartbeat", daemon=True)
        self.lost: str | None = None  # why the lease may be someone else's now

    def why_lost(self) -> str | None:
        return self.lost

    def _run(self) -> None:
        ttl = self.fleet.ttl_s
        last_ok, warned = time.monotonic(), False
        while not self.stopped.wait(ttl / 3):
            try:
                ours, holder = self.fleet.renew(self.token)
            except FleetLockUnavailable as e:
                late = time.monotonic() - last_ok
                if late > ttl and not warned:
                    warned = True
                    self.lost = f"not renewed for {late:.0f}s, ttl {ttl:g}s"
                    self.say(
                        f"WARNING: the fleet restart lock was not renewed for {late:.0f}s "
                        f"(ttl {ttl:g}s): {e}. Another restarter may take it over and restart "
                        "pairs at the same time as this one"
                    )
                continue
            if not ours:
                now = f"{holder.describe()} holds it now" if holder else "nobody holds it now"
                self.lost = now
                self.say(
                    f"WARNING: this restart lost the fleet restart lock ({now}): pairs may "
                    "restart elsewhere at the same time; check pdctl status"
                )
                return
            if warned:
                self.say("the fleet restart lock is renewed again; this restart still holds it")
            last_ok, warned, self.lost = time.monotonic(), False, None

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(self.fleet.timeout + 1)


@contextlib.contextmanager
def fleet_held(
    fleet: FleetLock,
    what: str,
    wait: float = 0.0,
    say: Callable[[str], None] | None = None,
    poll: float = 0.5,
    started: float | None = None,
) -> Iterator[Acquired]:
    """Hold the fleet lock's lease for `what`, renewed until the block ends, then released.

    Waits up to `wait` s from `started` (time.monotonic(); default now) for a holder
    (progress through `say` every 10 s), then LockHeld naming it. A stale holder is taken
    over with a warning. FleetLockUnavailable when the server does not answer."""
    say = say or _stderr
    t0, last = started if started is not None else time.monotonic(), None
    behind: Holder | None = None
    while True:
        try:
            got = fleet.acquire(what)
        except FleetLockUnavailable as e:
            raise FleetLockUnavailable(
                f"{e}; not restarting without it (a restart elsewhere could run at the same "
                f"time): check {names.LOCK_UNIT} on the first [router] host; --no-fleet-lock "
                "restarts without it (dangerous)"
            ) from None
        if isinstance(got, Grant):
            break
        now, behind = time.monotonic(), got
        if now - t0 >= wait:
            waited = f" after waiting {wait:g}s" if wait else ""
            raise LockHeld(
                f"another restart is running: {got.describe()} (fleet restart lock "
                f"{fleet.url}){waited}; wait for it to finish (or check that process)"
            )
        if last is None or now - last >= PROGRESS_EVERY_S:
            last = now
            say(
                f"waiting for the fleet restart lock, held by {got.describe()} "
                f"[{now - t0:.0f}s of {wait:g}s]"
            )
        time.sleep(min(poll, max(wait - (now - t0), 0.0)))
    took_over = None
    if got.took_over is not None:
        dead = got.took_over
        took_over = dead.describe()
        say(
            f"WARNING: took over the fleet restart lock from {took_over}: it was not renewed "
            f"for {dead.heartbeat_age_s or 0:.0f}s (ttl {dead.ttl_s or 0:g}s), so its holder "
            "is presumed dead. Check what it left behind (pdctl status: drained pairs)"
        )
    try:
        with _Heartbeat(fleet, got.token, say) as beat:
            waited_s = round(time.monotonic() - t0, 1) if behind else 0.0
            yield Acquired(
                waited_s, behind.describe() if behind else None, took_over, beat.why_lost
            )
    finally:
        try:
            fleet.release(got.token)
        except FleetLockUnavailable as e:
            say(
                f"WARNING: could not release the fleet restart lock ({e}); it frees itself "
                f"{fleet.ttl_s:g}s after its last renewal"
            )


@contextlib.contextmanager
def held(
    what: str,
    path: Path | None = None,
    wait: float = 0.0,
    say: Callable[[str], None] | None = None,
    poll: float = 0.5,
    fleet: FleetLock | None = None,
) -> Iterator[Acquired]:
    """Hold the restart lock for `what` (e.g. "pdctl restart --both --pair pd0"): this host's
    flock, then with `fleet` the fleet lock's lease.

    With `wait` > 0, wait that many seconds in all for the holders to finish (progress
    through `say`) before giving up with LockHeld."""
    t0 = time.monotonic()
    with _host_held(what, path, wait, say, poll) as host:
        if fleet is None:
            yield host
            return
        with fleet_held(fleet, what, wait, say, poll, started=t0) as got:
            behind = got.behind or host.behind
            waited_s = round(time.monotonic() - t0, 1) if behind else 0.0
            yield Acquired(waited_s, behind, got.took_over, got.lost)
