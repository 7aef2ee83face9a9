"""The deployment spec: profile models, inventory resolution and the resolved deployment."""

from pdctl.spec.deployment import Deployment, HostSpec, Instance
from pdctl.spec.load import load_deployment, load_profile
from pdctl.spec.profile import EngineKind, Profile, Role, Tuning

__all__ = [
    "Deployment",
    "EngineKind",
    "HostSpec",
    "Instance",
    "Profile",
    "Role",
    "Tuning",
    "load_deployment",
    "load_profile",
]
