"""Ansible's view of the deployment: the pdctl spec and renderer, as plain data.

The roles never derive a flag, a port or a unit name themselves; they template what
`pdctl.render` returns here, so `pdctl render` and site.yml cannot disagree. What they decide
from their registered results (which pairs restart and why, the firewall's sources) is
`pdctl.converge`'s, tested as Python.

Ansible imports every filter plugin in each forked worker that templates a filter, so the spec
and the renderer (pydantic, jinja2: a third of a second) are imported only by the worker that
parses the deployment: once per host and run (roles/pdstack/tasks/deployment.yml).
"""

from __future__ import annotations

import functools
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var

from pdctl import converge, escape, names
from pdctl.escape import systemd_command

if TYPE_CHECKING:
    from pdctl.spec import Deployment, Instance


def _instance(inst: Instance) -> dict[str, Any]:
    # Plain types only: Ansible 2.19 refuses enums and dataclasses in variables.
    return {
        "id": inst.id,
        "name": inst.name,
        "role": inst.role.value,
        "pair": inst.group,  # the pair's or group's name: the roles' unit of restart
        "group": inst.group,
        "kind": inst.kind,
        "numa_node": inst.numa_node,
        "gpus": list(inst.gpus),
        "port": inst.port,
        "bootstrap_port": inst.bootstrap_port,
        "unit": inst.unit,
        "pair_target": inst.pair_target,
        "url": inst.url,
    }


def _unit_vars(inst: Instance, dep: Deployment) -> dict[str, Any]:
    from pdctl import render

    ctx = render.unit_context(inst, dep)
    return {**ctx, "inst": _instance(inst)}


# The simulated engine's NIXL (pdctl.sim imports nixl_cu12), the pin the controller's venv and
# the sim's tests use too; installed without its dependencies (torch and CUDA, 5.7 GB).
SIM_NIXL_REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements" / "nixl-sim.txt"


def _requirements(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _packages(dep: Deployment) -> dict[str, dict[str, list[str]]]:
    """pip requirements per role: `deps` installed with theirs, `no_deps` without.

    `pdctl` comes from the wheelhouse (built from this checkout).
    """
    from pdctl.spec import EngineKind

    v = dep.profile.versions
    engine = ["pdctl"]
    no_deps: list[str] = []
    if dep.profile.engine.kind is EngineKind.SGLANG:
        engine = [f"sglang=={v.sglang}", f"{v.nixl_package}=={v.nixl}", *engine]
    elif dep.profile.engine.transfer_backend == "nixl":
        no_deps = _requirements(SIM_NIXL_REQUIREMENTS)
    # pdctl on a gateway host registers the pairs after each gateway start (ExecStartPost=).
    gateway = [f"{v.gateway_package}=={v.gateway}", "pdctl"]
    return {
        "engine": {"deps": engine, "no_deps": no_deps},
        "gateway": {"deps": gateway, "no_deps": []},
    }


def _wheelhouse_args(packages: dict[str, dict[str, list[str]]]) -> list[str]:
    """deploy/wheelhouse.sh's arguments: one wheelhouse for every role's packages."""
    deps = [p for r in packages.values() for p in r["deps"] if p != "pdctl"]
    no_deps = [p for r in packages.values() for p in r["no_deps"]]
    return [*dict.fromkeys(deps), *(["--no-deps", *dict.fromkeys(no_deps)] if no_deps else [])]


def _host(host_name: str, dep: Deployment) -> dict[str, Any]:
    host = next(h for h in dep.hosts if h.name == host_name)
    pairs: dict[str, dict[str, Any]] = {}
    for inst in host.instances:
        pair = pairs.setdefault(
            inst.group, {"pair": inst.group, "target": inst.pair_target, "units": []}
        )
        if inst.placed:
            pair["id"] = inst.group  # a group across hosts: one id in the fleet
        pair["units"].append(inst.unit)
    return {
        "address": host.address,
        "instances": [_unit_vars(i, dep) for i in host.instances],
        "pairs": list(pairs.values()),
        "gpus": sorted({g for i in host.instances for g in i.gpus}),
        "numa_nodes": sorted({i.numa_node for i in host.instances}),
        "ports": sorted(
            {i.port for i in host.instances}
            | {i.bootstrap_port for i in host.instances if i.bootstrap_port}
        ),
    }


def _model(dep: Deployment) -> dict[str, Any]:
    """The revision to stage (roles/pdstack_engine/tasks/stage.yml); staged false: model.path
    alone, already on every host."""
    from pdctl.model import manifest

    m = dep.profile.model
    if m.source is None:
        return {"staged": False}
    return {
        "staged": True,
        "kind": m.source.kind.value,
        "source": m.source.path,
        "revision": m.revision,
        "dir": m.path,
        "root": m.staging.root,
        # The source's manifest lands here first: the disk check reads it before any weight
        # is copied (a dot directory: never listed as a model).
        "incoming": f"{m.staging.root}/.incoming/{m.served_name}-{m.revision}.json",
        "manifest": manifest.MANIFEST,
        "verified": manifest.VERIFIED,
        "margin_gib": m.staging.free_margin_gib,
        "concurrency": m.staging.concurrency,
    }


def pdstack_stage_rsync(
    model: dict[str, Any],
    dest: str,
    address: str | None = None,
    ssh_config: str | None = None,
    only: str | None = None,
) -> list[str]:
    """pdctl.model.staging.rsync_argv for the deployment's `model` fact."""
    from pdctl.model.staging import rsync_argv

    return rsync_argv(model["kind"], model["source"], dest, address, ssh_config, only)


def _etcd(dep: Deployment) -> dict[str, Any]:
    """The store's members and files (roles/pdstack_etcd); `members` is empty when the inventory
    has no [etcd] hosts, which `pdctl validate` refuses in preflight."""
    from pdctl import render

    e = dep.profile.etcd
    return {
        "members": {
            m.name: {
                "address": m.address,
                "client_url": dep.etcd_client_url(m),
                "peer_url": dep.etcd_peer_url(m),
                "command_lines": render.etcd_command_lines(dep, m),
            }
            for m in dep.etcd
        },
        "endpoints": dep.etcd_endpoints,
        "initial_cluster": ",".join(f"{m.name}={dep.etcd_peer_url(m)}" for m in dep.etcd),
        "client_port": e.client_port,
        "peer_port": e.peer_port,
        "metrics_port": e.metrics_port,
        "snapshot_interval_s": e.snapshot_interval_s,
        "snapshot_keep": e.snapshot_keep,
        # Every host of the deployment gets a client certificate; the firewall lets them in.
        "clients": dep.inventory_hosts,
        "addresses": [_address(dep, h) for h in dep.inventory_hosts],
        "pki_dir": str(dep.pki_dir),
        "pki_args": [
            *(f"--member={m.name}={m.address}" for m in dep.etcd),
            *(f"--client={h}" for h in dep.inventory_hosts),
        ],
        "unit": names.ETCD_UNIT,
        "snapshot_unit": names.ETCD_SNAPSHOT_UNIT,
        "data_dir": names.ETCD_DATA_DIR,
        "state_name": Path(names.ETCD_DATA_DIR).name,  # the member unit's StateDirectory=
        "snapshot_dir": names.ETCD_SNAPSHOT_DIR,
        "tls_dir": names.ETCD_TLS_DIR,
        "ca": names.ETCD_CA,
        "client_cert": names.ETCD_CLIENT_CERT,
        "client_key": names.ETCD_CLIENT_KEY,
        "member_cert": names.ETCD_MEMBER_CERT,
        "member_key": names.ETCD_MEMBER_KEY,
        "credentials": render.ETCD_CREDENTIAL_FILES,
        "cluster_marker": names.ETCD_CLUSTER_MARKER,
    }


def _address(dep: Deployment, host: str) -> str:
    addresses = {h.name: h.address for h in dep.hosts}
    addresses |= {g.name: g.address for g in dep.gateways}
    addresses |= {m.name: m.address for m in dep.etcd}
    return addresses[host]


@functools.lru_cache(maxsize=8)
def _load(inventory_file: str, profile: str, _stamp: tuple[float, ...]) -> dict[str, Any]:
    from pdctl import render, topology
    from pdctl.errors import PdctlError
    from pdctl.spec import load_deployment

    try:
        dep = load_deployment(Path(inventory_file), Path(profile))
    except PdctlError as e:
        raise AnsibleFilterError(f"pdstack: {e}") from None
    r = dep.profile.router
    packages = _packages(dep)
    return {
        "profile": str(dep.profile_path),
        "engine_kind": dep.profile.engine.kind.value,
        "model_path": dep.profile.model.path,
        "model": _model(dep),
        "packages": packages,
        "wheelhouse_args": _wheelhouse_args(packages),
        "hosts": {h.name: _host(h.name, dep) for h in dep.hosts},
        "gateway": {
            # Every [router] host runs a gateway over all pairs; its URL by host.
            "urls": {g.name: dep.gateway_url(g) for g in dep.gateways},
            "unit": names.GATEWAY_UNIT,
            "env_file": names.GATEWAY_ENV_FILE,
            "key_var": names.GATEWAY_KEY_VAR,
            "url": dep.client_url,  # a client's default (the end-to-end tests)
            "port": r.port,
            "metrics_port": r.metrics_port,
            # The key's line only when the role has a key to write into env_file.
            "command_lines": render.gateway_command_lines(dep, api_key=False),
            "command_lines_api_key": render.gateway_command_lines(dep, api_key=True),
            # ExecStartPost= per gateway host: registers every pair, bound, after each start.
            "register": {
                g.name: systemd_command(render.register_command(g.name)) for g in dep.gateways
            },
            # The same command as argv, for the role's own run after a topology change.
            "register_argv": {g.name: render.register_command(g.name) for g in dep.gateways},
            # Per gateway host: its liveness key in etcd, kept while the gateway runs.
            "lease": {
                "unit": names.GATEWAY_LEASE_UNIT,
                "command": {
                    g.name: systemd_command(render.lease_command(g.name)) for g in dep.gateways
                },
            },
        },
        "etcd": _etcd(dep),
        # pdctl's host-to-host ssh: only when groups span hosts (docs/security.md).
        "peer_ssh": {
            "hosts": [h.name for h in dep.peer_ssh_hosts],
            "addresses": [h.address for h in dep.peer_ssh_hosts],
            "dir": names.PEER_SSH_DIR,
            "key": names.PEER_SSH_KEY,
            "config": names.PEER_SSH_CONFIG,
            "config_text": render.peer_ssh_config([h.address for h in dep.peer_ssh_hosts]),
            "known_hosts": names.PEER_SSH_KNOWN_HOSTS,
            "comment": names.PEER_SSH_COMMENT,
        },
        "topology": topology.dump(topology.from_deployment(dep)),
        "layout": {
            "install_dir": names.INSTALL_DIR,
            "venv": names.VENV,
            "pdctl_link": names.PDCTL_LINK,
            "config_dir": names.CONFIG_DIR,
            "state_dir": names.STATE_DIR,
            "unit_dir": names.UNIT_DIR,
            "unit_prefix": f"{names.PREFIX}-",  # every pdstack unit's name starts with it
            "user": names.SERVICE_USER,
            "topology_file": names.TOPOLOGY_FILE,
            "recover_unit": names.RECOVER_UNIT,
            "finish_service": names.FINISH_SERVICE,
            "finish_timer": names.FINISH_TIMER,
            "ops_env_file": names.OPS_ENV_FILE,
            "restart_pending_dir": names.RESTART_PENDING_DIR,
            "pair_unit_globs": list(names.PAIR_UNIT_GLOBS),
            "docs": list(names.DOCS),
            # engine.service.j2 and engine.env.j2: the files `pdctl render` renders.
            "templates_dir": str(render.templates_dir()),
            "documentation": names.documentation(),
        },
    }


def _mtime(path: str) -> float:
    p = Path(path)
    return p.stat().st_mtime if p.exists() else 0.0


def pdstack_deployment(inventory_file: str, profile: str) -> dict[str, Any]:
    """Everything the roles need, for every host: `inventory_file | pdstack_deployment(profile)`.

    Cached, since roles look it up per task; file times in the key make an edited file count.
    """
    profile = pdstack_profile_path(inventory_file, profile)
    return _load(str(inventory_file), profile, (_mtime(inventory_file), _mtime(profile)))


def pdstack_validate(inventory_file: str, profile: str, strict: bool = False) -> dict[str, Any]:
    """`pdctl validate` run in this Python: the same code as the command without starting a
    second Python (0.6 s of every site.yml run). Its exit code (`rc`), its text (`stdout`) and
    the `command` that prints the same (pdctl beside the Python that runs Ansible)."""
    from pdctl.lint.report import validation_report

    profile = pdstack_profile_path(inventory_file, profile)
    rc, text = validation_report(Path(inventory_file), Path(profile), strict)
    argv = [str(Path(sys.executable).parent / "pdctl"), "validate", "-i", inventory_file]
    argv += ["-p", profile, *(["--strict"] if strict else [])]
    return {"rc": rc, "stdout": text, "command": shlex.join(argv)}


def pdstack_profile_path(inventory_file: str, profile: str) -> str:
    """Relative profiles resolve against the inventory's directory, as pdctl resolves them."""
    from pdctl.spec.load import resolve_profile

    return str(resolve_profile(Path(inventory_file), profile))


def pdstack_stale_pairs(found_units: list[str], host_pairs: list[str]) -> dict[str, list[str]]:
    """What to stop and remove for the pairs that left this host (`pdctl.names.stale_pairs`)."""
    return names.stale_pairs(found_units, host_pairs)


def pdstack_unit_verify(unit: str) -> str:
    """A `validate:` command for a unit file: systemd-analyze wants the file under its unit
    name, and Ansible hands it a temporary file (`%s`)."""
    script = (
        'd=$(mktemp -d) && cp "$1" "$d/$0" && systemd-analyze verify "$d/$0"; '
        'r=$?; rm -rf "$d"; exit $r'
    )
    return f"/bin/sh -c {shlex.quote(script)} {shlex.quote(unit)} %s"


# The checkout this plugin belongs to: monitoring/ (the rule builder) sits beside it, outside
# the pdctl package that the controller's venv installs.
MONITORING = Path(__file__).resolve().parent.parent / "monitoring"


def _import_monitoring() -> None:
    """The checkout's `monitoring` package, imported from its folder by name alone: putting the
    checkout on sys.path would make every folder of it (tests, deploy, …) importable in
    Ansible's Python too."""
    if "monitoring" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "monitoring", MONITORING / "__init__.py", submodule_search_locations=[str(MONITORING)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["monitoring"] = package
        spec.loader.exec_module(package)


def pdstack_monitoring_rules(thresholds: dict[str, Any], runbook_url: str = "") -> str:
    """The pack's rules (monitoring/rules.py) with the deployment's thresholds over the defaults
    and its runbook address ("": the pack's). The selectors stay the defaults: they are the
    job names of the role's own scrape config."""
    _import_monitoring()
    from monitoring.config import ConfigError, load
    from monitoring.rules import render_rules

    overrides: dict[str, Any] = {"thresholds": thresholds}
    if runbook_url:
        overrides["runbook_url"] = runbook_url
    try:
        cfg = load(overrides)
    except ConfigError as e:
        raise AnsibleFilterError(f"the alert rules cannot be built: {e}") from e
    # Unsafe: the rules hold Prometheus' own {{ }} templating, never Ansible's.
    return wrap_var(render_rules(cfg))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "pdstack_deployment": pdstack_deployment,
            "pdstack_profile_path": pdstack_profile_path,
            "pdstack_validate": pdstack_validate,
            "pdstack_unit_verify": pdstack_unit_verify,
            "pdstack_monitoring_rules": pdstack_monitoring_rules,
            **escape.FILTERS,
            **converge.FILTERS,
            "pdstack_stale_pairs": pdstack_stale_pairs,
            "pdstack_stage_rsync": pdstack_stage_rsync,
        }
