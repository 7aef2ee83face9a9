"""The one place launch lines, environments and units are derived from the spec.

`pdctl render`, the Ansible roles (through filter_plugins/pdstack.py) and the SGLang parser
test all call these functions, so no flag is derived twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from pdctl import names
from pdctl.escape import FILTERS, systemd_command, systemd_word
from pdctl.spec import Deployment, EngineKind, Instance, Profile, Role
from pdctl.spec.deployment import EtcdMember
from pdctl.spec.profile import Router

STOP_TIMEOUT_S = 120
MANAGED = "Managed by pdstack (pdctl render / site.yml); local edits are overwritten."

ENGINE_MODULE = {EngineKind.SGLANG: "sglang.launch_server", EngineKind.SIM: "pdctl.sim"}


def templates_dir() -> Path:
    """The unit and env templates; the roles template the same files (the filter plugin hands
    them this directory). A checkout holds them in its top-level templates/, a wheel ships them
    as pdctl/templates (pyproject.toml's package-dir)."""
    package = Path(__file__).parent
    shipped = package / "templates"
    return shipped if shipped.is_dir() else package.parent / "templates"


def launch_args(inst: Instance, dep: Deployment) -> list[str]:
    """SGLang `launch_server` arguments for one instance (the executable excluded)."""
    return engine_args(inst, dep.profile)


def engine_args(inst: Instance, p: Profile) -> list[str]:
    """`launch_args` from the profile alone (`pdctl capacity --profile` has no inventory)."""
    t = inst.tuning
    args = [
        "--model-path", p.model.path,
        "--served-model-name", p.model.served_name,
        "--host", inst.address,
        "--port", str(inst.port),
        "--tp-size", str(inst.tp),
        "--disaggregation-mode", inst.role.value,
        "--disaggregation-transfer-backend", p.engine.transfer_backend,
    ]  # fmt: skip
    if inst.role is Role.PREFILL:
        args += ["--disaggregation-bootstrap-port", str(inst.bootstrap_port)]
    optional: list[tuple[str, object]] = [
        ("--mem-fraction-static", t.mem_fraction_static),
        ("--max-running-requests", t.max_running_requests),
        ("--context-length", t.context_length),
        ("--page-size", t.page_size),
        ("--kv-cache-dtype", t.kv_cache_dtype),
        ("--chunked-prefill-size", t.chunked_prefill_size),
        # Since sglang 0.5.15 graph sizes are per phase; plain --cuda-graph-max-bs is ambiguous.
        (f"--cuda-graph-max-bs-{inst.role.value}", t.cuda_graph_max_bs),
    ]
    args += [a for flag, value in optional if value is not None for a in (flag, str(value))]
    if t.cuda_graph_bs:
        args += [f"--cuda-graph-bs-{inst.role.value}", *map(str, t.cuda_graph_bs)]
    if t.disable_cuda_graph:
        args.append("--disable-cuda-graph")
    args.append("--enable-metrics")
    return args + list(t.extra_args)


def _numa_and_engine(inst: Instance, dep: Deployment, venv: str) -> tuple[list[str], list[str]]:
    numa = ["/usr/bin/numactl", f"--cpunodebind={inst.numa_node}", f"--membind={inst.numa_node}"]
    engine = [f"{venv}/bin/python", "-m", ENGINE_MODULE[dep.profile.engine.kind]]
    return numa, engine


def command(inst: Instance, dep: Deployment, venv: str = names.VENV) -> list[str]:
    """The full ExecStart: pinned to the instance's NUMA node, then the engine."""
    numa, engine = _numa_and_engine(inst, dep, venv)
    return numa + engine + launch_args(inst, dep)


def flag_lines(heads: list[list[str]], args: list[str]) -> list[str]:
    """A line per head, then one flag and its values per line, quoted for systemd's ExecStart=,
    so unit diffs read flag by flag. Values before the first flag stay on the last head's line.
    Only a flag starts a line, so no continuation line can start a comment."""
    lines = [systemd_command(head) for head in heads]
    for token in args:
        if token.startswith("--"):
            lines.append(systemd_word(token))
        else:
            lines[-1] += " " + systemd_word(token)
    return lines


def command_lines(inst: Instance, dep: Deployment, venv: str = names.VENV) -> list[str]:
    """`command` split by `flag_lines`."""
    numa, engine = _numa_and_engine(inst, dep, venv)
    return flag_lines([numa, engine], launch_args(inst, dep))


def environment(inst: Instance, dep: Deployment) -> dict[str, str]:
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, inst.gpus)),
        "PYTHONUNBUFFERED": "1",
        **inst.tuning.env,
    }
    if dep.profile.engine.kind is EngineKind.SIM:
        # The sim sizes its KV pool like the GPU the profile declares; explicit knobs win.
        model, hardware = dep.profile.model, dep.host(inst.host).hardware
        env.update(
            PDSIM_GPU_MEM_GIB=f"{hardware.gpu_memory_mib / 1024:.2f}",
            PDSIM_WEIGHTS_GIB=str(model.weights_gib_per_gpu),
            PDSIM_KV_BYTES_PER_TOKEN=str(model.kv_bytes_per_token),
        )
        if inst.role is Role.DECODE:
            # The decode counts KV taken from a prefill outside its pair or group (docs/sim.md,
            # cross-group): a pair's one prefill, a group's every prefill, comma-separated.
            group = next(g for g in dep.groups() if inst in g.decodes)
            env["PDSIM_PAIR_PARTNER"] = ",".join(
                f"{p.address}:{p.bootstrap_port}" for p in group.prefills
            )
        env.update({k: str(v) for k, v in dep.profile.sim.items()})
    return env


def router_args(dep: Deployment) -> list[str]:
    """`smg launch` arguments: PD mode with no workers. A worker on smg's command line cannot
    carry a pairing protocol, so the unit's ExecStartPost= registers every pair bound to
    itself (`register_command`; docs/gateway.md, "Groups stay groups")."""
    r = dep.profile.router
    args = [
        "launch", "--pd-disaggregation",
        "--host", r.host,
        "--port", str(r.port),
        "--policy", r.policy,
        "--prometheus-host", r.host,
        "--prometheus-port", str(r.metrics_port),
        "--request-timeout-secs", str(r.request_timeout_secs),
    ]  # fmt: skip
    return args + lifecycle_args(r) + list(r.extra_args)


def lifecycle_args(r: Router) -> list[str]:
    """smg's health checks, circuit breakers and registration window (docs/gateway.md,
    "The gateway's worker lifecycle"). Removal stays off whatever smg's default: without
    service discovery a worker smg removes never comes back."""
    return [
        "--health-check-interval-secs", str(r.health_check_interval_secs),
        "--health-failure-threshold", str(r.health_failure_threshold),
        "--health-success-threshold", str(r.health_success_threshold),
        "--health-check-timeout-secs", str(r.health_check_timeout_secs),
        "--no-remove-unhealthy-workers",
        "--cb-failure-threshold", str(r.cb_failure_threshold),
        "--cb-success-threshold", str(r.cb_success_threshold),
        "--cb-timeout-duration-secs", str(r.cb_timeout_duration_secs),
        "--cb-window-duration-secs", str(r.cb_window_duration_secs),
        "--worker-startup-timeout-secs", str(r.worker_startup_timeout_secs),
    ]  # fmt: skip


def gateway_command_lines(dep: Deployment, api_key: bool) -> list[str]:
    """The gateway's ExecStart split by `flag_lines`; with `api_key`, the key comes from the
    environment (the unit's EnvironmentFile), so it is never written into the unit."""
    lines = flag_lines([[names.GATEWAY_BIN]], router_args(dep))
    if api_key:
        # Unquoted: systemd substitutes ${VAR} with the value as one argument.
        lines.append(f"--api-key ${{{names.GATEWAY_KEY_VAR}}}")
    return lines


# How long the gateway unit's ExecStartPost= waits for smg to answer; inside systemd's
# default TimeoutStartSec (90 s), which bounds the whole start.
REGISTER_TIMEOUT_S = 60


def register_command(gateway_host: str) -> list[str]:
    """The gateway unit's ExecStartPost=: register every pair with this host's gateway, bound
    by pairing protocol. It reads the key from the unit's environment, like smg."""
    return [
        f"{names.VENV}/bin/pdctl", "gateway", "register",
        "--gateway", gateway_host, "--timeout", str(REGISTER_TIMEOUT_S),
    ]  # fmt: skip


def lease_command(gateway_host: str) -> list[str]:
    """The gateway lease unit's ExecStart: this host's gateway liveness key in etcd."""
    return [f"{names.VENV}/bin/pdctl", "gateway", "heartbeat", "--gateway", gateway_host]


ETCD_BIN = "/usr/bin/etcd"  # Debian's etcd-server


# The member's TLS files stay root's (0600); the unit hands them to the etcd user with
# LoadCredential=, under this directory, by these names (in the order etcd_args uses them).
def peer_ssh_config(addresses: list[str]) -> str:
    """The ssh config pdctl uses from one GPU host to the others that hold members of groups
    across hosts (`addresses`; names.PEER_SSH_CONFIG): its own key and known hosts, the peers'
    keys only (site.yml writes them from their facts). Other hosts get ssh's defaults, as
    before (root's own keys)."""
    return "\n".join(
        [
            "# Written by site.yml (pdstack): pdctl's ssh between the hosts of groups across",
            "# hosts (docs/security.md). Used by pdctl only (ssh -F).",
            f"Host {' '.join(addresses)}",
            f"  IdentityFile {names.PEER_SSH_KEY}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {names.PEER_SSH_KNOWN_HOSTS}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  UpdateHostKeys no",
            "  ForwardAgent no",
            "",
        ]
    )


ETCD_CREDENTIALS = f"/run/credentials/{names.ETCD_UNIT}"
ETCD_CREDENTIAL_FILES = {
    "member.crt": names.ETCD_MEMBER_CERT,
    "member.key": names.ETCD_MEMBER_KEY,
    "ca.crt": names.ETCD_CA,
}


def etcd_args(dep: Deployment, member: EtcdMember) -> list[str]:
    """The member's flags (never /etc/default/etcd, which Debian's own unit reads): mutual TLS
    on the client and peer listeners, metrics and /health on a plain HTTP port for
    Prometheus, the initial cluster from the [etcd] group. The cluster token (from the
    controller's PKI directory) and the initial cluster state (`new`; `existing` to join a
    running store) come at run time: the unit template adds them."""
    e = dep.profile.etcd
    tls = tuple(f"{ETCD_CREDENTIALS}/{name}" for name in ETCD_CREDENTIAL_FILES)
    return [
        "--name", member.name,
        "--data-dir", names.ETCD_DATA_DIR,
        # Every address: the firewall (and mutual TLS) decide who gets through.
        "--listen-client-urls", f"https://0.0.0.0:{e.client_port}",
        "--advertise-client-urls", dep.etcd_client_url(member),
        "--listen-peer-urls", f"https://0.0.0.0:{e.peer_port}",
        "--initial-advertise-peer-urls", dep.etcd_peer_url(member),
        "--listen-metrics-urls", f"http://0.0.0.0:{e.metrics_port}",
        "--initial-cluster", ",".join(f"{m.name}={dep.etcd_peer_url(m)}" for m in dep.etcd),
        "--client-cert-auth",
        "--cert-file", tls[0], "--key-file", tls[1], "--trusted-ca-file", tls[2],
        "--peer-client-cert-auth",
        "--peer-cert-file", tls[0], "--peer-key-file", tls[1], "--peer-trusted-ca-file", tls[2],
        # The lock and the gateways' keys are tiny; history has a bounded retention. Compact
        # hourly so the backend stays small between the snapshots.
        "--auto-compaction-mode", "periodic",
        "--auto-compaction-retention", "1h",
        "--logger", "zap",
    ]  # fmt: skip


def etcd_command_lines(dep: Deployment, member: EtcdMember) -> list[str]:
    return flag_lines([[ETCD_BIN]], etcd_args(dep, member))


@dataclass(frozen=True)
class RenderedInstance:
    instance: Instance
    command: list[str]
    environment: dict[str, str]
    env_file: str
    env_text: str  # the env file's content
    unit: str


def jinja_env(directory: Path | None = None) -> jinja2.Environment:
    """Jinja set up like Ansible's template module (trim_blocks, the `comment` filter).

    A role's `directory` is searched first, then the package's templates (the units' shared
    hardening.j2), as Ansible searches the role's folder and the template's own."""
    searchpath = [directory, templates_dir()] if directory else [templates_dir()]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(searchpath),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
    )
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in text.splitlines())
    env.filters.update(FILTERS)
    return env


def unit_context(inst: Instance, dep: Deployment) -> dict[str, Any]:
    """Variables of engine.service.j2 and engine.env.j2, shared with the Ansible template tasks."""
    return {
        "inst": inst,
        "command": command(inst, dep),
        "command_lines": command_lines(inst, dep),
        "env": environment(inst, dep),
        "env_file": inst.env_file,
        "recover_unit": names.recover_unit(inst.group),
        "documentation": names.documentation(),
        "state_dir": names.STATE_DIR,
        "user": names.SERVICE_USER,
        "stop_timeout_s": STOP_TIMEOUT_S,
    }


def render_instance(inst: Instance, dep: Deployment) -> RenderedInstance:
    ctx = unit_context(inst, dep)
    jenv = jinja_env()
    unit = jenv.get_template("engine.service.j2").render(ansible_managed=MANAGED, **ctx)
    env_text = jenv.get_template("engine.env.j2").render(ansible_managed=MANAGED, **ctx)
    return RenderedInstance(
        instance=inst,
        command=ctx["command"],
        environment=ctx["env"],
        env_file=ctx["env_file"],
        env_text=env_text,
        unit=unit,
    )
