"""`pdctl model status`: which revisions each GPU host holds (verified or not) and which model
each engine runs.

The data path is `pdctl status`'s: the topology names every host and its engines' units; each
host answers for itself. Here (the host running pdctl) that is `host_models`, which reads the
staging root and the running processes' --model-path (systemctl show's MainPID, then
/proc/PID/cmdline, as `pdctl doctor` reads running flags); elsewhere the same function runs
as `pdctl model status --local` over ssh with pdctl's ssh settings, and its JSON comes back.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdctl import names
from pdctl.model.revisions import Staged, model_path_arg, running_revision, staged_revisions
from pdctl.ops.systemd import SSH, HostError, Systemd, for_host, ssh_config

REMOTE_TIMEOUT_S = 60.0
HOST_WORKERS = 16


@dataclass(frozen=True)
class EngineModel:
    unit: str
    model_path: str | None  # None: the unit runs no process now
    revision: str | None  # the staged revision it runs; None: a path pdstack did not stage


@dataclass(frozen=True)
class HostModels:
    host: str
    staged: list[Staged] = field(default_factory=list)
    engines: list[EngineModel] = field(default_factory=list)
    error: str | None = None  # the host could not answer

    def runners(self, revision_path: str) -> list[str]:
        return [e.unit for e in self.engines if e.model_path == revision_path]


def engine_model(systemd: Systemd, unit: str, root: str) -> EngineModel:
    pid = systemd.show(unit).main_pid
    path = model_path_arg(systemd.cmdline(pid)) if pid else None
    staged = running_revision(root, path) if path else None
    return EngineModel(unit, path, staged[1] if staged else None)


def host_models(host: str, root: str, units: list[str], systemd: Systemd) -> HostModels:
    """This host's answer: its staging root read here, its units asked of systemd."""
    engines = [engine_model(systemd, unit, root) for unit in units]
    return HostModels(host, staged_revisions(Path(root)), engines)


def from_json(doc: dict[str, object]) -> HostModels:
    staged = [Staged(**s) for s in doc.get("staged", [])]  # type: ignore[attr-defined]
    engines = [EngineModel(**e) for e in doc.get("engines", [])]  # type: ignore[attr-defined]
    return HostModels(str(doc["host"]), staged, engines, doc.get("error"))  # type: ignore[arg-type]


def to_json(h: HostModels) -> dict[str, object]:
    return asdict(h)


def local_argv(host: str, root: str, units: list[str]) -> list[str]:
    """The host-local form, as another host runs it."""
    argv = [names.PDCTL_LINK, "model", "status", "--local", "--host", host, "--root", root]
    return argv + [a for u in units for a in ("--unit", u)] + ["--format", "json"]


def over_ssh(host: str, address: str, root: str, units: list[str]) -> HostModels:
    """`host_models` of a host: in this process when it is this one, else over ssh."""
    systemd = for_host(host, address)
    if systemd.ssh_target is None:
        return host_models(host, root, units, systemd)
    config = ssh_config()
    ssh = [*SSH, *(("-F", config) if config else ())]
    argv = [*ssh, systemd.ssh_target, shlex.join(local_argv(host, root, units))]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=REMOTE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return HostModels(host, error=f"no answer in {REMOTE_TIMEOUT_S:.0f}s")
    if cp.returncode != 0:
        last = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or [f"exit {cp.returncode}"]
        return HostModels(host, error=last[0])
    return from_json(json.loads(cp.stdout))


Ask = Callable[[str, str, str, list[str]], HostModels]


def fleet_models(
    hosts: dict[str, tuple[str, list[str]]], root: str, ask: Ask = over_ssh
) -> list[HostModels]:
    """Every host's answer, asked at once: hosts {name: (address, its engines' units)}. A host
    that cannot answer is listed with its error, the others still are."""

    def one(host: str) -> HostModels:
        address, units = hosts[host]
        try:
            return ask(host, address, root, units)
        except HostError as e:
            return HostModels(host, error=str(e))

    with ThreadPoolExecutor(HOST_WORKERS) as pool:
        return list(pool.map(one, sorted(hosts)))


def table(rows: list[HostModels]) -> list[str]:
    """A line per host and revision it holds, then a line per engine on a path not staged."""
    lines = [f"{'HOST':<16} {'MODEL/REVISION':<36} {'STATE':<10} RUN BY"]
    for h in rows:
        if h.error:
            lines.append(f"{h.host:<16} {'-':<36} {'unknown':<10} {h.error}")
            continue
        for s in h.staged:
            state = "verified" if s.verified else "partial"
            run_by = ", ".join(h.runners(s.path)) or "-"
            lines.append(
                f"{h.host:<16} {s.served_name + '/' + s.revision:<36} {state:<10} {run_by}"
            )
        for e in h.engines:
            if e.revision is None:
                state = "unstaged" if e.model_path else "stopped"
                lines.append(f"{h.host:<16} {e.model_path or '-':<36} {state:<10} {e.unit}")
    return lines
