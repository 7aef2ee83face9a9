"""One restart at a time: per host an flock, across the fleet a lease in etcd (pdctl.coord).

The host lock is an flock on /run/pdstack/restart.lock. flock dies with its holder, so a
crashed pdctl never leaves a stale lock behind; the file holds the holder's PID only so the
refusal can name it. Opened with O_NOFOLLOW: root must not truncate whatever a link planted at
the lock's name points to.

The fleet lock is a key under an etcd lease (pdctl.coord.lock): taken after the host lock,
renewed by a heartbeat thread every ttl/3, released at the end. A holder that stops renewing
for ttl (killed, paused, its host lost) loses it, and the next restarter takes it; the
history's record of the lost holder says whom it took over from.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pdctl import exits, names
from pdctl.coord.history import History, Outcome, Record
from pdctl.coord.lock import Grant, Holder, RestartLock
from pdctl.coord.restarts import Phases
from pdctl.coord.store import StoreUnavailable
from pdctl.errors import PdctlError

DEFAULT_PATH = Path(names.RESTART_LOCK)
PROGRESS_EVERY_S = 10.0
# A recovery waiting for etcd tries again after poll, 2 poll, ... up to this: once quorum is
# back, it has the lock within this many seconds.
STORE_RETRY_MAX_S = 10.0


def default_path() -> Path:
    return Path(os.environ.get("PDCTL_LOCK", DEFAULT_PATH))


class LockHeld(PdctlError):
    exit_code = exits.LOCK_HELD


def _never_lost() -> str | None:
    return None


def _ignore(_: Outcome) -> None:
    return None


@dataclass(frozen=True)
class Acquired:
    waited_s: float = 0.0
    behind: str | None = None  # the holder waited for ("PID 4242 pdctl restart ..."), if any
    took_over: str | None = None  # the fleet lock holder whose lease expired, if any
    # Why the fleet lock may no longer be this restart's (its lease expired, or etcd cannot
    # confirm it), None while it is: asked before each step of a restart.
    lost: Callable[[], str | None] = _never_lost
    # What the restart did, for the fleet's restart history (written when the lock is freed).
    record: Callable[[Outcome], None] = _ignore
    # Each target's phase, in etcd under the fleet lock's lease (None: no fleet lock).
    phases: Phases | None = None


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


# ----- the fleet lock: a key under an etcd lease (pdctl.coord.lock) ------------------------
def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Heartbeat:
    """Renews the lease every ttl/3 until stopped; says loudly when renewing fails for longer
    than the ttl (the lease may have expired: another restarter may hold the lock) or the lock
    is another's."""

    def __init__(self, fleet: RestartLock, grant: Grant, say: Callable[[str], None]) -> None:
        self.fleet, self.grant, self.say = fleet, grant, say
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleet-lock-heartbeat", daemon=True)
        self.lost: str | None = None  # why the lock may be someone else's now

    def why_lost(self) -> str | None:
        """The fencing check before each step: the heartbeat's word, then etcd's own."""
        if self.lost is not None:
            return self.lost
        try:
            self.lost = self.fleet.check(self.grant)
        except StoreUnavailable as e:
            return f"etcd cannot confirm that this restart still holds it: {e}"
        return self.lost

    def _run(self) -> None:
        ttl = self.fleet.ttl_s
        last_ok, warned = time.monotonic(), False
        while not self.stopped.wait(ttl / 3):
            try:
                ours, holder = self.fleet.renew(self.grant)
            except StoreUnavailable as e:
                late = time.monotonic() - last_ok
                if late > ttl and not warned:
                    warned = True
                    self.say(
                        f"WARNING: the fleet restart lock was not renewed for {late:.0f}s "
                        f"(ttl {ttl:g}s): {e}. Its lease may have expired; this restart stops "
                        "before its next step unless etcd confirms it still holds the lock"
                    )
                continue
            if not ours:
                now = f"{holder.describe()} holds it now" if holder else "nobody holds it now"
                self.lost = f"its lease expired; {now}"
                self.say(
                    f"WARNING: this restart lost the fleet restart lock ({now}); it stops "
                    "before its next step"
                )
                return
            if warned:
                self.say("the fleet restart lock is renewed again; this restart still holds it")
            last_ok, warned = time.monotonic(), False

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(self.fleet.timeout * 4 + 1)


def _unavailable(e: StoreUnavailable) -> StoreUnavailable:
    return StoreUnavailable(
        f"{e}; not restarting without the fleet restart lock (a restart elsewhere could run "
        "at the same time): pdctl doctor names the etcd members that are down; "
        "--no-fleet-lock restarts without it (dangerous)"
    )


def _acquire_waiting(
    fleet: RestartLock,
    what: str,
    targets: list[str] | None,
    wait: float,
    say: Callable[[str], None],
    poll: float,
    t0: float,
    store_wait: bool,
    on_wait: Callable[[str, Holder | None], None] | None,
) -> tuple[Grant, Holder | None]:
    """fleet_held's wait: the grant, and the holder it waited behind (None: none)."""
    last: float | None = None
    behind: Holder | None = None
    pause = poll
    while True:
        try:
            got: Grant | Holder | StoreUnavailable = fleet.acquire(what, targets)
        except StoreUnavailable as e:
            if not store_wait:
                raise _unavailable(e) from None
            got = e  # waited for like a holder, with a backoff: etcd may be out for minutes
        if isinstance(got, Grant):
            return got, behind
        now = time.monotonic()
        if now - t0 >= wait:
            if isinstance(got, StoreUnavailable):
                raise _unavailable(got)
            waited = f" after waiting {wait:g}s" if wait else ""
            raise LockHeld(
                f"another restart is running: {got.describe()} ({fleet.describe()}){waited}; "
                "wait for it to finish (or check that process)"
            )
        if isinstance(got, Holder):
            behind, pause, why = got, poll, f"held by {got.describe()}"
        else:
            pause, why = min(pause * 2, STORE_RETRY_MAX_S), f"etcd cannot serve: {got}"
        if on_wait is not None:
            on_wait(why, got if isinstance(got, Holder) else None)
        if last is None or now - last >= PROGRESS_EVERY_S:
            last = now
            say(f"waiting for the fleet restart lock, {why} [{now - t0:.0f}s of {wait:g}s]")
        time.sleep(min(pause, max(wait - (now - t0), 0.0)))


def _start_history(
    history: History, what: str, targets: list[str] | None, say: Callable[[str], None]
) -> tuple[Record | None, str | None]:
    """The restart's history record (None: etcd could not write it), and the holder whose
    lease expired before it finished, if there was one (a warning says so)."""
    try:
        rec = history.start(what, targets or [])
        lost = history.mark_lost(rec) if rec else None
    except StoreUnavailable as e:
        say(f"WARNING: the restart history is not written: {e}")
        return None, None
    if lost is None:
        return rec, None
    took_over = f"{lost.host} PID {lost.pid} {lost.command}"
    say(
        f"WARNING: the last holder of the fleet restart lock, {took_over}, lost it before "
        "it finished (its lease expired: killed, paused or cut off). Check what it left "
        "behind (pdctl status: drained groups; pdctl history)"
    )
    return rec, took_over


@contextlib.contextmanager
def fleet_held(
    fleet: RestartLock,
    what: str,
    wait: float = 0.0,
    say: Callable[[str], None] | None = None,
    poll: float = 0.5,
    started: float | None = None,
    store_wait: bool = False,
    on_wait: Callable[[str, Holder | None], None] | None = None,
    targets: list[str] | None = None,
) -> Iterator[Acquired]:
    """Hold the fleet lock for `what` (restarting `targets`), renewed until the block ends,
    then released, with a record in the restart history from start to end.

    Waits up to `wait` s from `started` (time.monotonic(); default now) for a holder
    (progress through `say` every 10 s), then LockHeld naming it. StoreUnavailable when etcd
    cannot serve (no quorum, no member answers), at once, or with `store_wait` after waiting
    for it too. `on_wait` hears why, and who holds it (None: etcd cannot tell), on each try
    that did not get the lock."""
    say = say or _stderr
    t0 = started if started is not None else time.monotonic()
    got, behind = _acquire_waiting(fleet, what, targets, wait, say, poll, t0, store_wait, on_wait)
    history = History(fleet.store)
    outcome = Outcome(result="failed", error="it ended before saying what it did")
    rec, took_over = _start_history(history, what, targets, say)

    def record(o: Outcome) -> None:
        nonlocal outcome
        outcome = o

    try:
        with _Heartbeat(fleet, got, say) as beat:
            waited_s = round(time.monotonic() - t0, 1) if behind else 0.0
            yield Acquired(
                waited_s,
                behind.describe() if behind else None,
                took_over,
                beat.why_lost,
                record,
                Phases(fleet.store, got.lease, what),
            )
    finally:
        try:
            if rec is not None:
                history.finish(rec, outcome)
            fleet.release(got)
        except StoreUnavailable as e:
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
    fleet: RestartLock | None = None,
    store_wait: bool = False,
    on_wait: Callable[[str, Holder | None], None] | None = None,
    targets: list[str] | None = None,
) -> Iterator[Acquired]:
    """Hold the restart lock for `what` (e.g. "pdctl restart --both --pair pd0") restarting
    `targets` (pair ids, instances or gateways): this host's flock, then with `fleet` the
    fleet lock's lease.

    With `wait` > 0, wait that many seconds in all for the holders to finish (progress
    through `say`) before giving up with LockHeld."""
    t0 = time.monotonic()
    with _host_held(what, path, wait, say, poll) as host:
        if fleet is None:
            yield host
            return
        with fleet_held(fleet, what, wait, say, poll, t0, store_wait, on_wait, targets) as got:
            behind = got.behind or host.behind
            waited_s = round(time.monotonic() - t0, 1) if behind else 0.0
            yield Acquired(waited_s, behind, got.took_over, got.lost, got.record, got.phases)
