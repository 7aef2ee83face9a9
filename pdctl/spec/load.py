"""Read a profile and an inventory into a resolved `Deployment`, or fail with file + key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdctl.errors import SpecError
from pdctl.spec.deployment import Deployment, HostSpec, Instance
from pdctl.spec.model import InstanceSpec, PairSpec, Profile, Role

ENGINE_GROUP = "pd_hosts"
ROUTER_GROUP = "router"
PROFILE_VAR = "pdstack_profile"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a deployment file that hides a mistake."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(str(path), where, f"malformed YAML: {problem}") from None


def key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(err: Any) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see the reference profile)"
    if kind == "missing":
        return "required key is missing"
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f", got {got!r}"
    return f"{msg[0].lower()}{msg[1:]}{shown}"


def load_profile(path: Path) -> Profile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(str(path), "", "a profile must be a YAML mapping (see deploy/profiles/)")
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise SpecError(str(path), key_path(first["loc"]), _describe(first)) from None


class Inventory:
    """The parts of an Ansible inventory pdctl needs, read by Ansible's own parser."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise SpecError(str(path), "", "inventory not found (pass -i/--inventory)")
        try:
            from ansible import constants
            from ansible.errors import AnsibleError
            from ansible.inventory.manager import InventoryManager
            from ansible.parsing.dataloader import DataLoader
        except ImportError:
            raise SpecError(
                str(path),
                "",
                "reading an Ansible inventory needs ansible-core, which is not installed: pip "
                "install 'pdctl[controller]'. On a converged host, pdctl status/restart/doctor "
                "read /etc/pdstack/topology.yaml instead (omit -i/-p).",
            ) from None

        # Ansible's parser only warns about a file it cannot read; make that an error here,
        # for this parse only (the filter plugin runs inside ansible-playbook itself).
        strict = {"INVENTORY_UNPARSED_IS_FAILED": True, "INVENTORY_ANY_UNPARSED_IS_FAILED": True}
        saved = {k: getattr(constants, k) for k in strict}
        try:
            for k, v in strict.items():
                setattr(constants, k, v)
            self._inv = InventoryManager(loader=DataLoader(), sources=[str(path)])
        except AnsibleError as e:
            raise SpecError(str(path), "", f"cannot parse inventory: {e.message}") from None
        finally:
            for k, v in saved.items():
                setattr(constants, k, v)

    def group(self, name: str) -> list[str]:
        group = self._inv.groups.get(name)
        if group is None:
            raise SpecError(str(self.path), f"[{name}]", "group is missing from the inventory")
        hosts = [h.name for h in group.get_hosts()]
        if not hosts:
            raise SpecError(str(self.path), f"[{name}]", "group has no hosts")
        return hosts

    def host_vars(self, host: str) -> dict[str, Any]:
        return dict(self._inv.get_host(host).get_vars())

    def all_vars(self) -> dict[str, Any]:
        return dict(self._inv.groups["all"].get_vars())


def profile_path_from(inventory: Inventory) -> Path:
    value = inventory.all_vars().get(PROFILE_VAR)
    if not value:
        raise SpecError(
            str(inventory.path), f"[all:vars] {PROFILE_VAR}", "not set; pass -p/--profile"
        )
    path = Path(str(value))
    return path if path.is_absolute() else inventory.path.parent / path


def load_deployment(inventory_path: Path, profile_path: Path | None = None) -> Deployment:
    inventory = Inventory(inventory_path)
    profile_path = profile_path or profile_path_from(inventory)
    profile = load_profile(profile_path)
    engine_hosts = inventory.group(ENGINE_GROUP)
    router_hosts = inventory.group(ROUTER_GROUP)
    for name in profile.hosts:
        if name not in engine_hosts:
            raise SpecError(
                str(profile_path),
                f"hosts.{name}",
                f"host is not in the inventory's [{ENGINE_GROUP}] group "
                f"({', '.join(engine_hosts)})",
            )
    hosts = [_resolve_host(name, profile, inventory) for name in engine_hosts]
    router = router_hosts[0]
    return Deployment(
        profile=profile,
        profile_path=profile_path,
        inventory_path=inventory_path,
        hosts=hosts,
        router_host=router,
        router_address=_address(router, inventory),
    )


def _address(host: str, inventory: Inventory) -> str:
    return str(inventory.host_vars(host).get("ansible_host", host))


def _resolve_host(name: str, profile: Profile, inventory: Inventory) -> HostSpec:
    override = profile.hosts.get(name)
    hardware = (override and override.hardware) or profile.hardware
    layout = (override and override.layout) or profile.layout
    address = _address(name, inventory)
    instances = [
        _instance(name, address, pair, role, profile)
        for pair in layout.pairs
        for role in (Role.PREFILL, Role.DECODE)
    ]
    return HostSpec(name=name, address=address, hardware=hardware, instances=instances)


def _instance(host: str, address: str, pair: PairSpec, role: Role, profile: Profile) -> Instance:
    spec: InstanceSpec = getattr(pair, role.value)
    return Instance(
        host=host,
        address=address,
        pair=pair.name,
        role=role,
        numa_node=spec.numa_node,
        gpus=tuple(spec.gpus),
        port=spec.port,
        bootstrap_port=spec.bootstrap_port,
        tp=spec.tp or len(spec.gpus),
        tuning=profile.engine.tuning(role),
    )
