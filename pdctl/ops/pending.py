""" "Restart pending" markers: a pair running on its old files after site.yml changed them.

site.yml with `pdstack_engine_restart_on_change: false` writes one JSON file per changed pair
(names.restart_pending: the reason and when); `pdctl status` shows it; the coordinated restart
(`pdctl restart --both`, `pdctl recover`) removes it, since the pair then runs the new files.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from pdctl import names
from pdctl.errors import PdctlError
from pdctl.ops.source import Pair
from pdctl.ops.systemd import Systemd

MAX_BYTES = 64 << 10  # a reason and a time; anything larger is not ours


class Pending(BaseModel):
    reason: str
    since: str  # ISO 8601, UTC, as Ansible wrote it


def parse(text: str) -> Pending:
    """A marker's content; an unreadable one still means a restart is pending."""
    try:
        return Pending.model_validate_json(text[:MAX_BYTES])
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        return Pending(reason=f"(unreadable marker: {where}: {first['msg']})", since="?")


def read(sd: Systemd, pair: Pair) -> Pending | None:
    """The pair's marker on its host, None when no restart is pending."""
    text = sd.read_file(names.restart_pending(pair.spec.name))
    return None if text is None else parse(text)


def clear(sd: Systemd, pair: Pair) -> None:
    sd.remove_file(names.restart_pending(pair.spec.name))


def describe(p: Pending | None, error: str | None = None) -> str | None:
    """The line `pdctl status` shows."""
    if error is not None:
        return f"restart pending: unknown ({error})"
    return None if p is None else f"restart pending: {p.reason} (since {p.since})"


def safe_read(sd: Systemd, pair: Pair) -> tuple[Pending | None, str | None]:
    try:
        return read(sd, pair), None
    except PdctlError as e:
        return None, str(e)
