"""One restart at a time per host: an flock on /run/pdstack/restart.lock.

flock dies with its holder, so a crashed pdctl never leaves a stale lock behind; the file
holds the holder's PID only so the refusal can name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pdctl.errors import PdctlError

DEFAULT_PATH = Path("/run/pdstack/restart.lock")


def default_path() -> Path:
    return Path(os.environ.get("PDCTL_LOCK", DEFAULT_PATH))


class LockHeld(PdctlError):
    exit_code = 3


@contextlib.contextmanager
def held(what: str, path: Path | None = None) -> Iterator[None]:
    """Hold the restart lock for `what` (e.g. "pdctl restart --both --pair pd0")."""
    path = path or default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown PID"
            raise LockHeld(
                f"another restart is running: PID {holder} holds {path}; "
                "wait for it to finish (or check that PID)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock
