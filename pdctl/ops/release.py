"""A group's release: the engine environment its units run from and the model revision they
load, kept on each host as one systemd drop-in per engine unit.

    /etc/systemd/system/<engine unit>.d/release.conf
    [Service]
    Environment=PDSTACK_ENV=/opt/pdstack/envs/sglang-0.5.23-1a2b3c4d
    Environment=PDSTACK_MODEL_PATH=/var/lib/pdstack/models/rev-2

The engine unit reads both variables in its ExecStart= (`${PDSTACK_ENV}/bin/python -m ...
--model-path ${PDSTACK_MODEL_PATH}`) and sets their defaults itself with Environment= lines
of its own: a drop-in's lines come after the unit's, so they win, and a unit without a
drop-in runs its defaults. Switching a group is: write its units' drop-ins on their hosts,
`systemctl daemon-reload` there, then the coordinated restart (pdctl.ops.restart); going back
is the same with the release before (no drop-in: the file is removed). Nothing is installed
or copied: the environment and the model revision are on the host already (staged).

The units site.yml writes name their environment in ExecStart= instead (the host's venv);
pdctl.ops.rollout refuses them (check_units_read_release) until the roles write units that
read the drop-in.
"""

from __future__ import annotations

import shlex
from functools import partial

from pydantic import BaseModel, ConfigDict, Field

from pdctl import names
from pdctl.errors import PdctlError
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.source import Pair
from pdctl.topology import TopologyInstance

ENV_VAR = "PDSTACK_ENV"  # the environment's directory: the unit runs its bin/python
MODEL_VAR = "PDSTACK_MODEL_PATH"  # the model revision's directory (--model-path)
DROPIN = "release.conf"
_ABSOLUTE = r"^/[A-Za-z0-9._+=@/-]*$"  # a path systemd's Environment= takes as one word


class Release(BaseModel):
    """What a group runs. `model` None: the unit's own --model-path (the profile's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field(pattern=_ABSOLUTE)
    model: str | None = Field(default=None, pattern=_ABSOLUTE)

    def describe(self) -> str:
        return self.env + ("" if self.model is None else f" + model {self.model}")


def describe(r: Release | None) -> str:
    """A release, or the unit's defaults (no drop-in)."""
    return "the unit's defaults" if r is None else r.describe()


def dropin(unit: str) -> str:
    return f"{names.UNIT_DIR}/{unit}.d/{DROPIN}"


def text(r: Release) -> str:
    lines = [f"Environment={ENV_VAR}={r.env}"]
    if r.model is not None:
        lines.append(f"Environment={MODEL_VAR}={r.model}")
    return "\n".join(["# Managed by pdctl rollout; pdctl rollout undo restores the one before.",
                      "[Service]", *lines, ""])  # fmt: skip


def parse(content: str, where: str) -> Release:
    """A drop-in's release; PdctlError naming `where` for one pdctl did not write."""
    found: dict[str, str] = {}
    for line in content.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "Environment":
            for word in shlex.split(value):
                var, _, val = word.partition("=")
                found[var] = val
    if ENV_VAR not in found:
        raise PdctlError(f"{where} sets no {ENV_VAR}: not a release drop-in pdctl wrote")
    try:
        return Release(env=found[ENV_VAR], model=found.get(MODEL_VAR))
    except ValueError as e:
        raise PdctlError(f"{where}: not a release: {e}") from None


def read(ops: Ops, inst: TopologyInstance) -> Release | None:
    """The release `inst` starts with (None: no drop-in, the unit's defaults)."""
    path = dropin(inst.unit)
    content = ops.systemd(inst.host).read_file(path)
    return None if content is None else parse(content, f"{inst.host}:{path}")


def of_group(ops: Ops, pair: Pair) -> Release | None:
    """The group's release; PdctlError when its members start with different ones (a switch
    that stopped half-way: say so rather than guess)."""
    got = {i.id: read(ops, i) for i in pair.instances}
    if len(set(got.values())) > 1:
        each = "; ".join(f"{k}: {describe(v)}" for k, v in got.items())
        raise PdctlError(f"{pair.id}: its members start with different releases ({each})")
    return next(iter(got.values()))


def ordered(pair: Pair, decode_first: bool) -> list[TopologyInstance]:
    """The members in the order their drop-ins are written: decodes first with
    `decode_first`, else prefills first (the topology's order)."""
    return [*pair.decodes, *pair.prefills] if decode_first else list(pair.instances)


def write(ops: Ops, pair: Pair, r: Release | None, decode_first: bool = False) -> None:
    """Each member's drop-in (`r` None: removed), host by host in member order, then one
    daemon-reload per host: the next start of the group runs `r`. Nothing restarts here."""
    members = ordered(pair, decode_first)
    hosts = list(dict.fromkeys(i.host for i in members))

    def on(host: str) -> None:
        sd = ops.systemd(host)
        for inst in (i for i in members if i.host == host):
            if r is None:
                sd.remove_file(dropin(inst.unit))
            else:
                sd.write_file(dropin(inst.unit), text(r))
        sd.daemon_reload()

    concurrently({h: partial(on, h) for h in hosts})
