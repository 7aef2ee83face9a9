"""The plan for people (a table, the layout to paste, what finer buckets buy) and for scripts."""

from __future__ import annotations

import math
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
    """Where the snippet puts engines: GPUs per host, the first engine and bootstrap ports and
    each NUMA node's GPUs (else the GPUs split evenly over NUMA_NODES); `--profile` gives its
    own."""

    gpus_per_host: int = 8
    first_port: int = FIRST_PORT
    first_bootstrap_port: int = FIRST_BOOTSTRAP_PORT
    numa_gpus: dict[int, list[int]] | None = None

    def numa(self, gpu: int) -> int:
        for node, gpus in (self.numa_gpus or {}).items():
            if gpu in gpus:
                return node
        return gpu // max(self.gpus_per_host // NUMA_NODES, 1)


@dataclass(frozen=True)
class HostLayout:
    """A layout every [pd_hosts] host repeats: `prefills` and `decodes` per host on `hosts`
    hosts. Profiles refuse groups across hosts (not supported yet), so this is what a snippet
    can propose; it may hold more engines than the plan when the plan's counts do not tile
    hosts."""

    hosts: int
    prefills: int
    decodes: int

    @staticmethod
    def closest(option: Option, shape: Shape, gpus_per_host: int) -> HostLayout | None:
        """The fewest GPUs (then hosts) holding at least the option's counts; None when one
        prefill and one decode do not fit a host."""
        gp, gd = shape.gpus_per_prefill, shape.gpus_per_decode
        np_, nd = option.prefill_instances, option.decode_instances
        found: list[tuple[int, int, HostLayout]] = []
        for p in range(1, (gpus_per_host - gd) // gp + 1):
            for d in range(1, (gpus_per_host - p * gp) // gd + 1):
                hosts = max(math.ceil(np_ / p), math.ceil(nd / d))
                found.append((hosts * (p * gp + d * gd), hosts, HostLayout(hosts, p, d)))
        return min(found, key=lambda f: f[:2])[2] if found else None

    def gpus(self, shape: Shape) -> int:
        return self.hosts * (
            self.prefills * shape.gpus_per_prefill + self.decodes * shape.gpus_per_decode
        )

    def note(self, option: Option, shape: Shape) -> str | None:
        """What differs from the option, if anything."""
        np_, nd = option.prefill_instances, option.decode_instances
        total_p, total_d = self.hosts * self.prefills, self.hosts * self.decodes
        if (total_p, total_d) == (np_, nd):
            return None
        gpus = np_ * shape.gpus_per_prefill + nd * shape.gpus_per_decode
        return (
            f"the layout runs {total_p} prefill + {total_d} decode on {self.hosts} hosts "
            f"({self.gpus(shape)} GPUs) for the recommended {np_} + {nd} ({gpus} GPUs): those "
            "counts need a group across hosts, which profiles do not support yet"
        )


def _member(gpus: list[int], site: Site, port: int, bootstrap: int | None) -> str:
    text = f"{{numa_node: {site.numa(gpus[0])}, gpus: [{', '.join(map(str, gpus))}], port: {port}"
    return text + (f", bootstrap_port: {bootstrap}}}" if bootstrap is not None else "}")


def layout_snippet(option: Option, shape: Shape, site: Site) -> str:
    """`layout:` for a profile, repeated on every [pd_hosts] host (HostLayout): host-local
    pairs when a host holds as many prefills as decodes, else one xPyD group per host."""
    gp, gd = shape.gpus_per_prefill, shape.gpus_per_decode
    per_host, port0, boot0 = site.gpus_per_host, site.first_port, site.first_bootstrap_port
    found = HostLayout.closest(option, shape, per_host)
    if found is None:
        return (
            f"# a prefill ({gp} GPUs) and a decode ({gd} GPUs) do not fit one {per_host}-GPU "
            "host: no host-local layout holds them, and profiles do not support groups across "
            "hosts yet"
        )
    hosts = f"on {found.hosts} [pd_hosts] host{'s' if found.hosts > 1 else ''}"
    lines = [f"# {note}" for note in [found.note(option, shape)] if note]
    if found.prefills == found.decodes:
        lines += [f"layout:  # {hosts}", "  pairs:"]
        for i in range(found.prefills):
            base = i * (gp + gd)
            prefill = _member(list(range(base, base + gp)), site, port0 + 2 * i, boot0 + i)
            decode = _member(list(range(base + gp, base + gp + gd)), site, port0 + 2 * i + 1, None)
            lines += [f"    - name: pd{i}", f"      prefill: {prefill}", f"      decode: {decode}"]
        return "\n".join(lines)
    lines += [f"layout:  # {hosts}", "  groups:", "    - name: g0", "      prefill:"]
    used = 0
    for i in range(found.prefills):
        lines.append(
            f"        - {_member(list(range(used, used + gp)), site, port0 + i, boot0 + i)}"
        )
        used += gp
    lines.append("      decode:")
    for i in range(found.decodes):
        port = port0 + found.prefills + i
        lines.append(f"        - {_member(list(range(used, used + gd)), site, port, None)}")
        used += gd
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
    console.print(
        "Profile layout (every [pd_hosts] host runs it; edit gpus and ports to your hosts):",
        markup=False,
    )
    console.print(layout, markup=False, highlight=False, soft_wrap=True)
