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
