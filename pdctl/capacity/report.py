"""The plan for people (a table, the layout to paste, what finer buckets buy) and for scripts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from pdctl.analyze.report import fmt_num
from pdctl.capacity.search import Engines, Option, Plan, Shape, Targets
from pdctl.capacity.workload import Workload

FIRST_PORT = 30000
FIRST_BOOTSTRAP_PORT = 8998
NUMA_NODES = 2  # per host, GPUs split evenly between them (the reference host's shape)


@dataclass(frozen=True)
class Site:
    """Where the snippet puts engines: GPUs per host, the first engine and bootstrap ports,
    host names for `host:` (else host1, host2, …) and each NUMA node's GPUs (else the GPUs
    split evenly over NUMA_NODES); `--profile` gives its own."""

    gpus_per_host: int = 8
    first_port: int = FIRST_PORT
    first_bootstrap_port: int = FIRST_BOOTSTRAP_PORT
    hosts: tuple[str, ...] = ()
    numa_gpus: dict[int, list[int]] | None = None

    def numa(self, gpu: int) -> int:
        for node, gpus in (self.numa_gpus or {}).items():
            if gpu in gpus:
                return node
        return gpu // max(self.gpus_per_host // NUMA_NODES, 1)

    def host(self, n: int) -> str:
        return self.hosts[n] if n < len(self.hosts) else f"host{n + 1}"


def _member(gpus: list[int], site: Site, port: int, bootstrap: int | None) -> str:
    text = f"{{numa_node: {site.numa(gpus[0])}, gpus: [{', '.join(map(str, gpus))}], port: {port}"
    return text + (f", bootstrap_port: {bootstrap}}}" if bootstrap is not None else "}")


def layout_snippet(option: Option, shape: Shape, site: Site) -> str:
    """`layout:` for a profile. Equal counts that tile hosts evenly become host-local pairs
    (repeated on every [pd_hosts] host); anything else one xPyD group, its members placed on
    hosts in order (`host:` names to replace with the inventory's)."""
    np_, nd = option.prefill_instances, option.decode_instances
    gp, gd = shape.gpus_per_prefill, shape.gpus_per_decode
    per_host, port0, boot0 = site.gpus_per_host, site.first_port, site.first_bootstrap_port
    per_pair_host = per_host // (gp + gd)
    if np_ == nd and per_pair_host and (np_ <= per_pair_host or np_ % per_pair_host == 0):
        on_host = min(np_, per_pair_host)
        hosts = np_ // on_host
        lines = [f"layout:  # on {hosts} [pd_hosts] host{'s' if hosts > 1 else ''}", "  pairs:"]
        for i in range(on_host):
            base = i * (gp + gd)
            prefill = _member(list(range(base, base + gp)), site, port0 + 2 * i, boot0 + i)
            decode = _member(list(range(base + gp, base + gp + gd)), site, port0 + 2 * i + 1, None)
            lines += [f"    - name: pd{i}", f"      prefill: {prefill}", f"      decode: {decode}"]
        return "\n".join(lines)
    placed: dict[str, list[tuple[int, str]]] = {"prefill": [], "decode": []}
    host, used, port, boot = 0, 0, port0, boot0
    for role, gpus in [("prefill", gp)] * np_ + [("decode", gd)] * nd:
        if used + gpus > per_host:
            host, used, port, boot = host + 1, 0, port0, boot0
        member = _member(list(range(used, used + gpus)), site, port,
                         boot if role == "prefill" else None)  # fmt: skip
        placed[role].append((host, member))
        used, port, boot = used + gpus, port + 1, boot + (role == "prefill")
    spans = host > 0
    lines = [
        "layout:",
        "  groups:",
        f"    - name: g0{'' if spans else '  # on every [pd_hosts] host'}",
    ]
    for role, members in placed.items():
        lines.append(f"      {role}:")
        for h, member in members:
            where = f"host: {site.host(h)}, " if spans else ""
            lines.append(f"        - {{{where}{member[1:]}")
    return "\n".join(lines)


def as_dict(
    plan: Plan, layout: str, load: Workload, targets: Targets, engines: Engines
) -> dict[str, Any]:
    finer = plan.finer
    return {
        "recommended": plan.recommended.core(),
        "options": [o.as_dict() for o in plan.options],
        "layout": layout,
        "finer_buckets": None
        if finer is None
        else {
            "basis": finer.label,
            "cuda_graph_bs_decode": finer.buckets.sizes,
            "decode_max_running_requests": finer.buckets.cap,
            "decode_instances": finer.decode_instances or None,
        },
        "warnings": plan.warnings,
        "workload": {
            "rate": load.rate,
            "lengths": load.source,
            "mean_input": load.mean_input,
            "mean_output": load.mean_output,
        },
        "targets": {
            **{f"ttft_{Targets.label(q)}_ms": t for q, t in targets.ttft_ms.items()},
            **{f"itl_{Targets.label(q)}_ms": t for q, t in targets.itl_ms.items()},
        },
        "assumed": {  # what the TTFT and the cap were computed with
            "chunked_prefill_size": engines.chunk_tokens,
            "handoff_ms": engines.handoff.fixed_ms,
            "kv_transfer_ms_per_token": engines.handoff.ms_per_token,
            "gateway_policy": engines.policy,
            "decode_kv_pool_tokens": engines.kv_pool_tokens,
        },
    }


def _bs(sizes: list[int]) -> str:
    return " ".join(map(str, sizes))


def finer_text(plan: Plan) -> str | None:
    """The recommended buckets against the other list (finer, or SGLang's default)."""
    finer, best = plan.finer, plan.recommended
    if finer is None:
        return None
    now = f"these buckets allow {best.buckets.cap} running requests per decode"
    alt = f"{finer.label} buckets would allow {finer.buckets.cap}"
    if not finer.decode_instances:
        return f"{now}; {finer.label} buckets meet the ITL target at no batch size"
    need = (
        f"the rate needs {best.decode_instances} decodes either way"
        if finer.decode_instances == best.decode_instances
        else f"the rate would need {finer.decode_instances} decodes instead of "
        f"{best.decode_instances}"
    )
    return f"{now}, {alt}: {need}"


def render(plan: Plan, layout: str, targets: Targets, console: Console) -> None:
    table = Table(
        title="Layouts that meet the targets (P prefills, D decodes; latencies in ms)",
        title_justify="left",
    )
    ttft_qs, itl_qs = sorted(targets.ttft_ms), sorted(targets.itl_ms)
    columns = ["P", "D", "GPUs", "max run", "graphs"]
    columns += [f"TTFT {Targets.label(q)}" for q in ttft_qs]
    columns += [f"ITL {Targets.label(q)}" for q in itl_qs]
    columns += ["out tok/s", "per GPU", "room"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=col == "graphs")
    for o in plan.options:
        table.add_row(
            f"{'★' if o is plan.recommended else ''}{o.prefill_instances}",
            str(o.decode_instances),
            str(o.gpus),
            str(o.buckets.cap),
            o.buckets.basis,
            *(fmt_num(o.prefill.ttft_ms[q], 0) for q in ttft_qs),
            *(fmt_num(o.decode.itl_ms[q]) for q in itl_qs),
            fmt_num(o.output_tok_s, 0),
            fmt_num(o.tok_s_per_gpu, 0),
            f"{100 * o.headroom:.0f}%",
        )
    console.print(table)
    best = plan.recommended
    console.print(
        f"Recommended (★): {best.prefill_instances} prefill + {best.decode_instances} decode, "
        f"{best.gpus} GPUs; decode --max-running-requests {best.buckets.cap} "
        f"--cuda-graph-bs-decode {_bs(best.buckets.sizes)}"
    )
    if (text := finer_text(plan)) is not None:
        console.print(f"Buckets: {text}")
    for w in plan.warnings:
        console.print(f"[yellow]Warning:[/yellow] {w}")
    console.print("Profile layout (edit gpus, ports and host names to your hosts):")
    console.print(layout, markup=False, highlight=False, soft_wrap=True)
