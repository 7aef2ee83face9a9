"""Automatic recovery: an engine unit's `OnFailure=pdstack-recover@PAIR.service` runs
`pdctl recover --pair PAIR`, the coordinated restart of the whole pair.

Rate-limited through a state file: after `max_count` recoveries of a pair within `window_s`
it does nothing, says why, and exits non-zero, leaving the failed unit failed so the alert
fires instead of the pair flapping.

recover runs as root, so the state file lives in a folder only root can write (not the
service user's /var/lib/pdstack): every file operation goes through a descriptor of that
verified folder, never follows a link, and writes a fresh O_EXCL name before renaming it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import FiniteFloat, TypeAdapter, ValidationError

from pdctl import exits, names
from pdctl.coord.lock import Holder
from pdctl.errors import PdctlError
from pdctl.ops import lock
from pdctl.ops.context import Ops, to_stderr
from pdctl.ops.report import Report
from pdctl.ops.restart import Reach, drop, outcome, restart_pair, stop_pair
from pdctl.ops.source import Pair

DEFAULT_STATE = Path(names.RECOVER_STATE)
MAX_STATE_BYTES = 1 << 20  # a few timestamps per pair; anything larger is not ours
# A restart holding the lock (one pair: drain + health + canary, minutes) finishes well
# within this; the recover unit's TimeoutStartSec (1800 s) covers this wait plus the restart.
LOCK_WAIT_S = 600.0

_STATE = TypeAdapter(dict[str, list[FiniteFloat]])


def default_state() -> Path:
    return Path(os.environ.get("PDCTL_RECOVER_STATE", DEFAULT_STATE))


class RateLimited(PdctlError):
    exit_code = exits.RATE_LIMITED


@dataclass(frozen=True)
class RateLimit:
    max_count: int = 3
    window_s: float = 3600.0


def _warn(line: str) -> None:
    to_stderr(f"Warning: {line}")


@contextlib.contextmanager
def _state_dir(path: Path) -> Iterator[int]:
    """A descriptor of the state folder, created 0700 if missing; refused unless it is a real
    folder owned by this user and writable by no one else."""
    fix = f"install -d -m 0700 -o {os.geteuid()} {path}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise PdctlError(f"state folder {path}: cannot create it ({e.strerror}); {fix}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        what = "a symbolic link" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
        raise PdctlError(f"state folder {path}: {what}; remove it, then {fix}") from None
    try:
        st = os.fstat(fd)
        problem = None
        if st.st_uid != os.geteuid():
            problem = f"is owned by UID {st.st_uid}, not {os.geteuid()}"
        elif st.st_mode & 0o022:
            problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        if problem:
            raise PdctlError(
                f"state folder {path} {problem}: its owner could make recover overwrite any "
                f"file through it; refusing. Fix: chown {os.geteuid()} {path} && chmod 0700 "
                f"{path}, or --state in a folder only UID {os.geteuid()} can write"
            )
        yield fd
    finally:
        os.close(fd)


class RecoveryLog:
    """Recovery start times per pair, in a JSON file that survives reboots of pdctl."""

    def __init__(
        self,
        path: Path,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self.path, self.clock, self.warn = path, clock, warn

    def _load(self, dir_fd: int) -> dict[str, list[float]]:
        """The state, or {} with a warning when it is unreadable: a broken state file must
        never stop recovery (it only forgets earlier recoveries)."""
        name = self.path.name
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except FileNotFoundError:
            return {}
        except OSError as e:
            why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
            return self._reset(f"{why}")
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return self._reset("not a regular file")
            raw = f.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            return self._reset(f"larger than {MAX_STATE_BYTES} bytes")
        try:
            return _STATE.validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            return self._reset(f"{where}: {first['msg']}")

    def _reset(self, why: str) -> dict[str, list[float]]:
        self.warn(
            f"recover state {self.path} is unreadable ({why}); starting it afresh "
            "(earlier recoveries no longer count towards the rate limit)"
        )
        return {}

    def _write(self, dir_fd: int, data: dict[str, list[float]]) -> None:
        tmp = f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(data))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
        except OSError as e:
            raise PdctlError(f"cannot write the recover state {self.path}: {e.strerror}") from None

    def _recent(self, data: dict[str, list[float]], pair: str, window_s: float) -> list[float]:
        now = self.clock()
        return [t for t in data.get(pair, []) if now - t < window_s]

    def recent(self, pair: str, window_s: float) -> list[float]:
        with _state_dir(self.path.parent) as dir_fd:
            return self._recent(self._load(dir_fd), pair, window_s)

    def admit(self, pair: str, limit: RateLimit) -> None:
        """Record a recovery, or raise RateLimited when the pair had too many."""
        with _state_dir(self.path.parent) as dir_fd:
            data = self._load(dir_fd)
            recent = self._recent(data, pair, limit.window_s)
            if len(recent) >= limit.max_count:
                raise RateLimited(
                    f"{pair}: {len(recent)} recoveries in the last {limit.window_s:.0f}s (limit "
                    f"{limit.max_count}); not restarting again. The failed unit stays failed "
                    f"for the alert; fix the cause, then run: pdctl restart --both --pair {pair}"
                )
            data[pair] = [*recent, self.clock()]
            self._write(dir_fd, data)


def _notify_status(line: str) -> None:
    """The unit's StatusText (systemctl status, pdctl status): sd_notify's STATUS=, when
    systemd runs this with NotifyAccess=main; nothing elsewhere."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return
    addr = "\0" + where[1:] if where.startswith("@") else where
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(f"STATUS={line}".encode(), addr)


class Containment:
    """While a recovery waits for the fleet lock, the broken pair is taken out of every
    gateway that answers (but those gone: restart.Reach) and its live side is stopped, once:
    no request is routed into a half pair for as long as the wait lasts. Not while the
    lock's holder lists this very pair in its targets (its own restart is bringing it back);
    a holder whose targets are unknown (an older pdctl's record) is not counted on."""

    def __init__(self, ops: Ops, pair: Pair) -> None:
        self.ops, self.pair, self.done = ops, pair, False

    def __call__(self, why: str, holder: Holder | None) -> None:
        _notify_status(f"recovery waiting: {why}")
        if self.done or (holder is not None and self.pair.id in holder.targets):
            return
        self.done = True
        ops, pair = self.ops, self.pair
        drop(ops, pair, Reach(ops, pair))
        try:
            stop_pair(ops, pair)
        except PdctlError as e:
            ops.say(f"{pair.id}: cannot stop its live side ({e})")
            return
        ops.say(
            f"{pair.id}: out of every gateway that answers and both sides stopped while the "
            f"recovery waits ({why})"
        )


def recover(
    ops: Ops,
    pair: Pair,
    limit: RateLimit,
    log: RecoveryLog,
    lock_path: Path | None = None,
    lock_wait: float = LOCK_WAIT_S,
) -> Report:
    """The coordinated restart, once the rate limit and the restart lock (this host's, and
    the fleet's when `ops.fleet_lock` is set) allow it.

    A restart holding the lock (an operator's roll, another pair's recovery) is waited for,
    bounded, and so is etcd when it cannot serve (no quorum): the crash still needs
    recovering after it. While it waits the pair is contained (Containment); after the
    bound it exits non-zero and systemd starts it again (Restart=on-failure)."""
    what = f"pdctl recover --pair {pair.id}"
    with lock.held(
        what,
        lock_path,
        lock_wait,
        ops.say,
        ops.timeouts.poll,
        ops.fleet_lock,
        store_wait=True,
        on_wait=Containment(ops, pair),
        targets=[pair.id],
    ) as got:
        _notify_status("recovering")
        if got.behind:
            ops.say(f"{pair.id}: the restart lock is free after {got.waited_s:.0f}s; recovering")
        log.admit(pair.id, limit)
        # The pair is already broken: a gateway we cannot reach must not block recovery, and
        # no request it holds can finish.
        rep = restart_pair(ops, pair, planned=False, lock_lost=got.lost, phases=got.phases)
        got.record(outcome([rep]))
    after = f" after waiting {got.waited_s:.0f}s for {got.behind}" if got.behind else ""
    verdict = "recovered" if rep.ok else "recovery FAILED"
    ops.say(f"{pair.id}: {verdict}: restarted prefill and decode together{after}")
    return rep
