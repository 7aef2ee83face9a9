"""systemd, on this host or another: unit state, start/stop, journal lines, process argv.

Every engine is stopped through its unit (cgroup kill), never by matching a command line.
A remote host is reached with `ssh HOST systemctl|journalctl ...` (systemctl -H cannot read
journals or /proc); every call has a timeout and names the host when it fails. `$PDCTL_SSH_USER`
is the remote user (root), `$PDCTL_SSH_CONFIG` an ssh config file (`ssh -F`, e.g. a test fleet's);
without it, the host-to-host ssh site.yml installs for groups across hosts
(names.PEER_SSH_CONFIG) when it is there.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Protocol

from pdctl import names
from pdctl.errors import PdctlError

SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
SHOW_PROPS = (
    "LoadState,ActiveState,SubState,MainPID,ActiveEnterTimestamp,NRestarts,ExecStart,StatusText"
)
_ARGV_RE = re.compile(r"argv\[\]=(.*?) ;")


class HostError(PdctlError):
    """A host that cannot be reached, or a systemctl that failed there."""


@dataclass(frozen=True)
class UnitStatus:
    unit: str
    load: str  # loaded | not-found
    active: str  # active | activating | deactivating | inactive | failed
    sub: str
    main_pid: int
    since: float | None  # epoch seconds of ActiveEnterTimestamp
    restarts: int
    exec_start: list[str] = field(default_factory=list)
    status_text: str = ""  # what the service says of itself (sd_notify STATUS=)


def parse_show(unit: str, text: str) -> UnitStatus:
    """`systemctl show --timestamp=unix -p ...` output."""
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    since = props.get("ActiveEnterTimestamp", "").lstrip("@")
    m = _ARGV_RE.search(props.get("ExecStart", ""))
    return UnitStatus(
        unit=unit,
        load=props.get("LoadState", "unknown"),
        active=props.get("ActiveState", "unknown"),
        sub=props.get("SubState", "unknown"),
        main_pid=int(props.get("MainPID") or 0),
        since=float(since) if since.isdigit() and int(since) > 0 else None,
        restarts=int(props.get("NRestarts") or 0),
        exec_start=m[1].split() if m else [],
        status_text=props.get("StatusText", ""),
    )


class Systemd(Protocol):
    host: str

    def show(self, unit: str) -> UnitStatus: ...
    def start(self, *units: str) -> None: ...
    def stop(self, *units: str) -> None: ...
    def restart(self, *units: str) -> None: ...
    def reset_failed(self, *units: str) -> None: ...
    def journal(self, unit: str, lines: int = 30) -> list[str]: ...
    def cmdline(self, pid: int) -> list[str]: ...
    def read_file(self, path: str) -> str | None: ...
    def remove_file(self, path: str) -> None: ...
    def write_file(self, path: str, text: str) -> None: ...
    def daemon_reload(self) -> None: ...


class Systemctl:
    """systemctl/journalctl here (`ssh=None`) or through `ssh ... ADDRESS`."""

    def __init__(
        self,
        host: str,
        ssh_target: str | None = None,
        timeout: float = 30.0,
        job_timeout: float = 300.0,
        ssh: tuple[str, ...] = tuple(SSH),
    ) -> None:
        self.host, self.ssh_target, self.ssh = host, ssh_target, list(ssh)
        self.timeout, self.job_timeout = timeout, job_timeout

    def _run(
        self,
        argv: list[str],
        timeout: float | None = None,
        check: bool = True,
        stdin: str | None = None,
    ) -> str:
        full = [*self.ssh, self.ssh_target, shlex.join(argv)] if self.ssh_target else argv
        try:
            cp = subprocess.run(
                full,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout or self.timeout,
                input=stdin,
            )
        except subprocess.TimeoutExpired:
            raise HostError(
                f"{self.host}: `{shlex.join(argv)}` timed out after {timeout or self.timeout:.0f}s"
            ) from None
        except OSError as e:
            raise HostError(f"{self.host}: cannot run {full[0]}: {e.strerror}") from None
        if check and cp.returncode != 0:
            # ssh itself exits 255 when the host is unreachable.
            what = "unreachable" if self.ssh_target and cp.returncode == 255 else "failed"
            detail = (cp.stderr or cp.stdout).strip().splitlines()[-3:]
            raise HostError(f"{self.host}: {what}: `{shlex.join(argv)}`: {' | '.join(detail)}")
        return cp.stdout

    def show(self, unit: str) -> UnitStatus:
        out = self._run(["systemctl", "show", "--timestamp=unix", "-p", SHOW_PROPS, unit])
        return parse_show(unit, out)

    def _job(self, verb: str, units: tuple[str, ...]) -> None:
        self._run(["systemctl", verb, *units], timeout=self.job_timeout)

    def start(self, *units: str) -> None:
        self._job("start", units)

    def stop(self, *units: str) -> None:
        self._job("stop", units)

    def restart(self, *units: str) -> None:
        self._job("restart", units)

    def reset_failed(self, *units: str) -> None:
        self._run(["systemctl", "reset-failed", *units], check=False)

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        out = self._run(
            ["journalctl", "-u", unit, "-n", str(lines), "-o", "cat", "--no-pager"], check=False
        )
        return out.splitlines()

    def cmdline(self, pid: int) -> list[str]:
        if self.ssh_target:
            raw = self._run(["cat", f"/proc/{pid}/cmdline"], check=False)
        else:
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    raw = f.read()
            except OSError:
                return []
        return [a for a in raw.split("\0") if a]

    def read_file(self, path: str) -> str | None:
        """A small file's text; None when it does not exist."""
        if not self.ssh_target:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return f.read()
            except FileNotFoundError:
                return None
            except OSError as e:
                raise HostError(f"{self.host}: cannot read {path}: {e.strerror}") from None
        # The first line says whether it exists, so a failing cat or ssh still raises.
        script = 'if test -e "$0"; then echo y; cat -- "$0"; else echo n; fi'
        present, _, text = self._run(["sh", "-c", script, path]).partition("\n")
        return text if present == "y" else None

    def remove_file(self, path: str) -> None:
        if not self.ssh_target:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise HostError(f"{self.host}: cannot remove {path}: {e.strerror}") from None
            return
        self._run(["rm", "-f", "--", path])

    def write_file(self, path: str, text: str) -> None:
        """A small file (root's, 0644), its folder made first; written beside it and renamed
        over it, so that a reader (systemd's daemon-reload) never sees half of it."""
        script = 'mkdir -p -- "$(dirname -- "$0")" && cat > "$0.tmp" && mv -f -- "$0.tmp" "$0"'
        self._run(["sh", "-c", script, path], stdin=text)

    def daemon_reload(self) -> None:
        self._run(["systemctl", "daemon-reload"], timeout=self.job_timeout)


def is_local(host: str, address: str) -> bool:
    """This machine is `host` when the name matches or the address can be bound here."""
    if host in (socket.gethostname(), socket.gethostname().split(".")[0]):
        return True
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def ssh_config(peer_config: str = names.PEER_SSH_CONFIG) -> str | None:
    """`$PDCTL_SSH_CONFIG`, else pdstack's host-to-host config when this host has one: a
    recovery unit cannot see /root/.ssh (ProtectHome=)."""
    given = os.environ.get("PDCTL_SSH_CONFIG")
    if given:
        return given
    return peer_config if os.path.exists(peer_config) else None


def for_host(host: str, address: str, config: str | None = None) -> Systemctl:
    """systemctl for `host`: here, or over ssh with the `config` file (default: ssh_config)."""
    user = os.environ.get("PDCTL_SSH_USER", "root")
    config = config or ssh_config()
    ssh = (*SSH, "-F", config) if config else tuple(SSH)
    return Systemctl(host, None if is_local(host, address) else f"{user}@{address}", ssh=ssh)
