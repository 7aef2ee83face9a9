"""The one place launch lines, environments and units are derived from the spec.

`pdctl render`, the Ansible roles (through filter_plugins/pdstack.py) and the SGLang parser
test all call these functions, so no flag is derived twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from pdctl.escape import env_file_value, systemd_command, systemd_word
from pdctl.spec import Deployment, EngineKind, Instance, Role

INSTALL_DIR = "/opt/pdstack"
VENV = f"{INSTALL_DIR}/venv"
CONFIG_DIR = "/etc/pdstack"
STATE_DIR = "/var/lib/pdstack"
SERVICE_USER = "pdstack"
STOP_TIMEOUT_S = 120
MANAGED = "Managed by pdstack (pdctl render / site.yml); local edits are overwritten."

ENGINE_MODULE = {EngineKind.SGLANG: "sglang.launch_server", EngineKind.SIM: "pdctl.sim"}


def templates_dir() -> Path:
    return Path(os.environ.get("PDSTACK_TEMPLATES", Path(__file__).parent.parent / "templates"))


def launch_args(inst: Instance, dep: Deployment) -> list[str]:
    """SGLang `launch_server` arguments for one instance (the executable excluded)."""
    p, t = dep.profile, inst.tuning
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


def command(inst: Instance, dep: Deployment, venv: str = VENV) -> list[str]:
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


def command_lines(inst: Instance, dep: Deployment, venv: str = VENV) -> list[str]:
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
            # The decode counts KV taken from any other prefill (docs/sim.md, cross-pair).
            prefill = next(p for p, d in dep.pairs() if d == inst)
            env["PDSIM_PAIR_PARTNER"] = f"{prefill.address}:{prefill.bootstrap_port}"
        env.update({k: str(v) for k, v in dep.profile.sim.items()})
    return env


def router_args(dep: Deployment) -> list[str]:
    """`smg launch` arguments: every prefill (with bootstrap port) and decode of the inventory."""
    r = dep.profile.router
    args = ["launch", "--pd-disaggregation"]
    for prefill, decode in dep.pairs():
        args += ["--prefill", prefill.url, str(prefill.bootstrap_port)]
        args += ["--decode", decode.url]
    args += [
        "--host", r.host,
        "--port", str(r.port),
        "--policy", r.policy,
        "--prometheus-host", r.host,
        "--prometheus-port", str(r.metrics_port),
        "--health-check-interval-secs", str(r.health_check_interval_secs),
    ]  # fmt: skip
    return args + list(r.extra_args)


@dataclass(frozen=True)
class RenderedInstance:
    instance: Instance
    command: list[str]
    environment: dict[str, str]
    env_file: str
    env_text: str  # the env file's content
    unit: str


# The quoting filters the templates use; filter_plugins/pdstack.py gives Ansible the same.
FILTERS = {"pdstack_env_value": env_file_value}


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
    )
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in text.splitlines())
    env.filters.update(FILTERS)
    return env


def unit_context(inst: Instance, dep: Deployment) -> dict[str, Any]:
    """Variables of templates/engine.service.j2, shared with the Ansible template task."""
    return {
        "inst": inst,
        "command": command(inst, dep),
        "command_lines": command_lines(inst, dep),
        "env": environment(inst, dep),
        "env_file": f"{CONFIG_DIR}/{inst.name}.env",
        "install_dir": INSTALL_DIR,
        "state_dir": STATE_DIR,
        "user": SERVICE_USER,
        "stop_timeout_s": STOP_TIMEOUT_S,
    }


def render_instance(inst: Instance, dep: Deployment) -> RenderedInstance:
    ctx = unit_context(inst, dep)
    jenv = _jinja()
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
