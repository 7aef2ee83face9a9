"""One restart at a time per host: an flock on /run/pdstack/restart.lock.

flock dies with its holder, so a crashed pdctl never leaves a stale lock behind; the file
holds the holder's PID only so the refusal can name it. Opened with O_NOFOLLOW: root must
not truncate whatever a link planted at the lock's name points to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pdctl import names
from pdctl.errors import PdctlError

DEFAULT_PATH = Path(names.RESTART_LOCK)
PROGRESS_EVERY_S = 10.0


def default_path() -> Path:
    return Path(os.environ.get("PDCTL_LOCK", DEFAULT_PATH))


class LockHeld(PdctlError):
    exit_code = 3


@dataclass(frozen=True)
class Acquired:
    waited_s: float = 0.0
    behind: str | None = None  # the holder waited for ("4242 pdctl restart ..."), if any


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
    since: float  # when it took the lock (time.time())


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
def held(
    what: str,
    path: Path | None = None,
    wait: float = 0.0,
    say: Callable[[str], None] | None = None,
    poll: float = 0.5,
) -> Iterator[Acquired]:
    """Hold the restart lock for `what` (e.g. "pdctl restart --both --pair pd0").

    With `wait` > 0, wait that many seconds for the holder to finish (progress through
    `say`) before giving up with LockHeld."""
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
            yield Acquired(round(time.monotonic() - t0, 1) if behind else 0.0, behind)
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock
