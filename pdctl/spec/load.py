"""Read a profile and an inventory into a resolved `Deployment`, or fail with file + key path."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdctl import names
from pdctl.errors import SpecError
from pdctl.spec.deployment import Deployment, EtcdMember, GatewayHost, HostSpec, Instance
from pdctl.spec.profile import (
    LONG_CONTEXT_ENV,
    GroupSpec,
    InstanceSpec,
    Layout,
    MemberSpec,
    Profile,
    Role,
    long_context_allowed,
)
from pdctl.spec.text import control_problem, host_problem

ENGINE_GROUP = "pd_hosts"
ROUTER_GROUP = "router"
ETCD_GROUP = "etcd"
PKI_DIR_VAR = "pdstack_etcd_pki_dir"
PROFILE_VAR = "pdstack_profile"
# A profile is a few KiB; the cap answers a wrong file at once instead of parsing megabytes.
MAX_PROFILE_BYTES = 1 << 20
# Values after YAML anchors/aliases expand: bounds the walk over a maliciously aliased file.
MAX_PROFILE_VALUES = 100_000
MAX_FLOW_DEPTH = 64
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a deployment file that hides a mistake."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # The scanner's work grows with the square of the flow depth: `[[[[...` would hang.
        if self.flow_level >= MAX_FLOW_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, f"nested deeper than {MAX_FLOW_DEPTH} levels", self.get_mark()
            )
        super().fetch_flow_collection_start(TokenClass)  # type: ignore[misc]


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


def read_yaml(path: Path, max_bytes: int = MAX_PROFILE_BYTES) -> Any:
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror}") from None
    if len(raw) > max_bytes:
        raise SpecError(
            str(path), "", f"larger than {max_bytes // 1024} KiB: not a deployment file"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            str(path),
            "",
            f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            "a deployment file is YAML text",
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(str(path), where, f"malformed YAML: {problem}") from None
    except RecursionError:  # block nesting (indentation), too deep for the composer
        raise SpecError(str(path), "", "malformed YAML: nested too deeply") from None


def key_path(loc: tuple[int | str, ...]) -> str:
    """`engine.common.env.NCCL_ALGO`, `layout.pairs[0]`; a key with other characters is shown
    quoted (`env['NCCL ALGO']`). Pydantic's `[key]` marker (the key itself is wrong) is dropped."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _describe(err: Any) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see the reference profile)"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":  # our own validators: the message names the value already
        return str(err["ctx"]["error"])
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f", got {_short(got)}"
    return f"{msg[0].lower()}{msg[1:]}{shown}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_strings(data: Any, path: Path) -> None:
    """No control character in any key or value: every string may reach a unit, an env file,
    a command line or a label. Walks iteratively, with a budget, so neither deep nesting nor
    alias bombs make it slow."""
    stack: list[tuple[tuple[int | str, ...], Any]] = [((), data)]
    seen = 0
    while stack:
        loc, node = stack.pop()
        seen += 1
        if seen > MAX_PROFILE_VALUES:
            raise SpecError(
                str(path),
                "",
                f"more than {MAX_PROFILE_VALUES} values (each YAML alias counted as the copy "
                "it expands to): not a deployment file",
            )
        if isinstance(node, dict):
            for key, value in node.items():
                child = (*loc, key if isinstance(key, str) else str(key))
                if isinstance(key, str) and (problem := control_problem(key)):
                    raise SpecError(str(path), key_path(child), f"in this key: {problem}")
                stack.append((child, value))
        elif isinstance(node, list):
            stack.extend(((*loc, i), v) for i, v in enumerate(node))
        elif isinstance(node, str) and (problem := control_problem(node)):
            raise SpecError(str(path), key_path(loc), problem)


def load_profile(path: Path) -> Profile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(str(path), "", "a profile must be a YAML mapping (see deploy/profiles/)")
    _check_strings(data, path)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise SpecError(str(path), key_path(first["loc"]), _describe(first)) from None
    _check_context_length(profile, path)
    return profile


def _check_context_length(profile: Profile, path: Path) -> None:
    """SGLang refuses a context_length above the model's own at start-up unless its override
    variable is true; with it, the lint rule `context-over-native` warns instead."""
    native = profile.model.native_context_length
    engine = profile.engine
    for role in Role:
        tuning = engine.tuning(role)
        context = tuning.context_length
        if native is None or context is None or context <= native:
            continue
        if long_context_allowed(tuning.env):
            continue
        key = engine.tuning_key(role, "context_length")
        raise SpecError(
            str(path),
            key,
            f"{context} is above model.native_context_length ({native}): SGLang refuses it at "
            f'start-up; allowed: at most {native}, or also set {LONG_CONTEXT_ENV}: "1" in '
            f"{key.removesuffix('context_length')}env to override (a lint warning then)",
        )


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
                f"read {names.TOPOLOGY_FILE} instead (omit -i/-p).",
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

    def optional_group(self, name: str) -> list[str]:
        """The group's hosts; none when it is missing or empty (a lint rule says so)."""
        group = self._inv.groups.get(name)
        return [h.name for h in group.get_hosts()] if group is not None else []

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
    return resolve_profile(inventory.path, str(value))


def resolve_profile(inventory_path: Path, profile: str) -> Path:
    """A relative profile path is relative to the inventory's directory."""
    path = Path(profile)
    return path if path.is_absolute() else inventory_path.parent / path


# The audit event (PEP 578) each parse raises, with the inventory and profile paths: how
# benchmarks/site_noop.py counts site.yml's parses without a hook in the code it measures.
PARSE_EVENT = "pdctl.spec.load_deployment"


def load_deployment(inventory_path: Path, profile_path: Path | None = None) -> Deployment:
    inventory = Inventory(inventory_path)
    profile_path = profile_path or profile_path_from(inventory)
    sys.audit(PARSE_EVENT, str(inventory_path), str(profile_path))
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
    _check_placed(profile, profile_path, engine_hosts)
    hosts = [_resolve_host(name, profile, inventory) for name in engine_hosts]
    _check_transfer_paths(profile, profile_path, hosts)
    return Deployment(
        profile=profile,
        profile_path=profile_path,
        inventory_path=inventory_path,
        hosts=hosts,
        gateways=[GatewayHost(name, _address(name, inventory)) for name in router_hosts],
        etcd=[
            EtcdMember(name, _address(name, inventory))
            for name in inventory.optional_group(ETCD_GROUP)
        ],
        pki_dir=pki_dir_from(inventory),
    )


def pki_dir_from(inventory: Inventory) -> Path:
    """The controller's etcd PKI: pdstack_etcd_pki_dir (relative: to the inventory's
    directory), else pki/ next to the inventory."""
    value = inventory.all_vars().get(PKI_DIR_VAR) or "pki"
    path = Path(str(value))
    return path if path.is_absolute() else inventory.path.parent / path


def _address(host: str, inventory: Inventory) -> str:
    """The host's address (ansible_host, else its name); both reach command lines and labels."""
    if problem := (control_problem(host) or host_problem(host)):
        raise SpecError(str(inventory.path), host, f"inventory host name: {problem}")
    address = str(inventory.host_vars(host).get("ansible_host", host))
    if problem := (control_problem(address) or host_problem(address)):
        raise SpecError(str(inventory.path), f"{host}.ansible_host", problem)
    return address


def _check_placed(profile: Profile, path: Path, engine_hosts: list[str]) -> None:
    """Groups whose members name hosts: each host is a [pd_hosts] host, and no host's own
    layout names a pair or group like it (`--pair NAME` and its units would be ambiguous)."""
    groups = profile.layout.groups
    for g, group in enumerate(groups):
        if not group.placed:
            continue
        for role, n, spec in _numbered(group):
            if spec.host not in engine_hosts:
                raise SpecError(
                    str(path),
                    f"layout.groups[{g}].{role.value}[{n}].host",
                    f"group {group.name!r} member {names.instance_name(group.name, role.value, n)}"
                    f": host {spec.host!r} is not in the inventory's [{ENGINE_GROUP}] group "
                    f"({', '.join(engine_hosts)}); name one of those, or add it there",
                )
        for host, override in profile.hosts.items():
            if override.layout:
                local = [p.name for p in override.layout.pairs]
                local += [x.name for x in override.layout.groups]
                if group.name in local:
                    raise SpecError(
                        str(path),
                        f"hosts.{host}.layout",
                        f"names a pair or group {group.name!r}, the name of the group across "
                        f"hosts layout.groups[{g}]: rename one (its id is its name alone)",
                    )


# Backends that move KV over TCP whatever the host has.
TCP_BACKENDS = ("mooncake_tcp",)


def _check_transfer_paths(profile: Profile, path: Path, hosts: list[HostSpec]) -> None:
    """A group across hosts moves KV between them: RDMA on each of its hosts, or an explicit
    `allow_tcp_kv: true` (lint rule group-tcp-kv warns what that costs)."""
    by_name = {h.name: h for h in hosts}
    backend = profile.engine.transfer_backend
    for g, group in enumerate(profile.layout.groups):
        spanned = group.hosts()
        if len(spanned) < 2 or group.allow_tcp_kv:
            continue
        for host in spanned:
            problem = _no_rdma(by_name[host], backend)
            if problem is None:
                continue
            inst = next(i for i in by_name[host].instances if i.placed and i.group == group.name)
            raise SpecError(
                str(path),
                f"layout.groups[{g}]",
                f"group {group.name!r} spans {', '.join(spanned)}, and its member {inst.name} "
                f"on {host} has no RDMA path: {problem}, so its KV would cross hosts over TCP; "
                f"give {host} one, or set allow_tcp_kv: true on the group (a rehearsal)",
            )


def _no_rdma(host: HostSpec, backend: str) -> str | None:
    """Why KV cannot leave `host` over RDMA; None when it can."""
    nics = host.hardware.rdma_nics
    if backend in TCP_BACKENDS:
        return f"engine.transfer_backend {backend} moves KV over TCP"
    if not nics:
        return "its hardware lists no rdma_nics"
    devices = {i.tuning.env.get("UCX_NET_DEVICES") for i in host.instances}
    if backend == "nixl":
        for d in devices - {None}:
            named = [x.strip().split(":")[0] for x in str(d).split(",") if ":" in x]
            if not set(named) & set(nics):
                return f"UCX_NET_DEVICES={d} names none of its RDMA NICs {nics}"
    return None


def _numbered(group: GroupSpec) -> Iterator[tuple[Role, int, MemberSpec]]:
    for role in Role:
        for n, spec in enumerate(group.members(role)):
            yield role, n, spec


def _resolve_host(name: str, profile: Profile, inventory: Inventory) -> HostSpec:
    override = profile.hosts.get(name)
    hardware = (override and override.hardware) or profile.hardware
    layout = (override and override.layout) or profile.layout
    address = _address(name, inventory)
    instances = layout_instances(name, address, layout, profile)
    instances += [
        _instance(name, address, group, role, member, spec, profile, placed=True)
        for group, role, member, spec in placed_members(profile.layout, name)
    ]
    return HostSpec(name=name, address=address, hardware=hardware, instances=instances)


def layout_instances(host: str, address: str, layout: Layout, profile: Profile) -> list[Instance]:
    """The host-local instances `layout` puts on one host, in `members` order."""
    return [
        _instance(host, address, group, role, member, spec, profile)
        for group, role, member, spec in members(layout)
    ]


def members(layout: Layout) -> Iterator[tuple[str, Role, int | None, InstanceSpec]]:
    """Every host-local member of the layout as (group, role, member number, spec): pairs
    first, each a 1P1D group whose sides keep a pair's names (number None), then the groups,
    prefills before decodes, numbered from 0 per role. The one place pairs become groups.
    Groups whose members name hosts are `placed_members`."""
    for pair in layout.pairs:
        for role in Role:
            yield pair.name, role, None, getattr(pair, role.value)
    for group in layout.groups:
        if not group.placed:
            for role, n, spec in _numbered(group):
                yield group.name, role, n, spec


def placed_members(layout: Layout, host: str) -> Iterator[tuple[str, Role, int, InstanceSpec]]:
    """The members on `host` of the groups whose members name hosts, numbered per role over
    the whole group (g1-decode1 is the group's second decode, wherever it runs)."""
    for group in layout.groups:
        if group.placed:
            for role, n, spec in _numbered(group):
                if spec.host == host:
                    yield group.name, role, n, spec


def _instance(
    host: str,
    address: str,
    group: str,
    role: Role,
    member: int | None,
    spec: InstanceSpec,
    profile: Profile,
    placed: bool = False,
) -> Instance:
    return Instance(
        host=host,
        address=address,
        group=group,
        role=role,
        member=member,
        numa_node=spec.numa_node,
        gpus=tuple(spec.gpus),
        port=spec.port,
        bootstrap_port=spec.bootstrap_port,
        tp=spec.tp or len(spec.gpus),
        tuning=profile.engine.tuning(role),
        placed=placed,
    )
