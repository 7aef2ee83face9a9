"""Profile key paths for a finding's fix, pointing at the key the user should edit."""

from __future__ import annotations

from pdctl.spec import Deployment, Instance, Role


def tuning_key(dep: Deployment, role: Role, field: str) -> str:
    """The role's key if its section sets it, else common's if set there, else the role's."""
    return dep.profile.engine.tuning_key(role, field)


def instance_key(dep: Deployment, inst: Instance, field: str) -> str:
    override = dep.profile.hosts.get(inst.host)
    prefix, layout = "layout", dep.profile.layout
    # A group across hosts lives in the top-level layout, whatever a host overrides.
    if override and override.layout and not inst.placed:
        prefix, layout = f"hosts.{inst.host}.layout", override.layout
    if inst.member is None:
        index = next(i for i, p in enumerate(layout.pairs) if p.name == inst.group)
        return f"{prefix}.pairs[{index}].{inst.role.value}.{field}"
    index = next(i for i, g in enumerate(layout.groups) if g.name == inst.group)
    return f"{prefix}.groups[{index}].{inst.role.value}[{inst.member}].{field}"


def hardware_key(dep: Deployment, host: str, field: str) -> str:
    override = dep.profile.hosts.get(host)
    prefix = f"hosts.{host}.hardware" if override and override.hardware else "hardware"
    return f"{prefix}.{field}"
