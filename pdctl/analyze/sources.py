"""Where a journal comes from: a file (plain or gzip), stdin, or journalctl (local or ssh).

Everything is handed on as a binary stream read in chunks, so nothing holds the journal in
memory; journalctl's stdout is read straight from the pipe while it runs.
"""

from __future__ import annotations

import gzip
import io
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, BinaryIO, cast

from pdctl.analyze.logparse import TimeWindow
from pdctl.errors import PdctlError

GZIP_MAGIC = b"\x1f\x8b"


@contextmanager
def open_file(path: str) -> Iterator[BinaryIO]:
    """`-` is stdin; gzip is recognised by its magic bytes, whatever the name."""
    if path == "-":
        raw: Any = sys.stdin.buffer
        close = False
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed below, after gzip wraps it
        except OSError as e:
            raise PdctlError(f"{path}: {e.strerror}") from e
        close = True
    # peek() needs a buffered reader; a test runner's stdin may be a bare BytesIO.
    buffered: Any = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
    try:
        if buffered.peek(2)[:2] == GZIP_MAGIC:
            yield cast(BinaryIO, gzip.GzipFile(fileobj=buffered, mode="rb"))
        else:
            yield buffered
    except (OSError, EOFError) as e:
        raise PdctlError(f"{path}: {e}") from e
    finally:
        if close:
            raw.close()


def journalctl_command(
    unit: str, host: str | None, since: str | None, until: str | None
) -> list[str]:
    cmd = ["journalctl", "-u", unit, "-o", "cat", "--no-pager"]
    if since:
        cmd += ["--since", since]
    if until:
        cmd += ["--until", until]
    if host:
        # ssh hands the remote side one string: quote it so spaces in --since survive.
        return ["ssh", "-o", "BatchMode=yes", host, shlex.join(cmd)]
    return cmd


@contextmanager
def open_journal(
    unit: str, host: str | None = None, since: str | None = None, until: str | None = None
) -> Iterator[BinaryIO]:
    """journalctl's stdout as it is produced; a failing journalctl/ssh raises with its stderr."""
    cmd = journalctl_command(unit, host, since, until)
    # stderr goes to a file: a pipe nobody reads could fill and stall journalctl.
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        except OSError as e:
            raise PdctlError(f"cannot run {cmd[0]}: {e.strerror}") from e
        stdout = cast(BinaryIO, proc.stdout)
        try:
            yield stdout
        finally:
            stdout.close()
            rc = proc.wait()
        if rc != 0:
            err.seek(0)
            detail = err.read().decode(errors="replace").strip()
            raise PdctlError(f"{shlex.join(cmd)} exited {rc}: {detail}")


def parse_time(value: str | None, option: str) -> str | None:
    """An ISO date or date-time, normalised to the journal's `YYYY-mm-dd HH:MM:SS`."""
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError as e:
        raise PdctlError(f"{option} {value!r}: use YYYY-mm-dd[ HH:MM[:SS]] with --file") from e


def file_window(since: str | None, until: str | None) -> TimeWindow:
    return TimeWindow(parse_time(since, "--since"), parse_time(until, "--until"))
