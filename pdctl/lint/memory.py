"""The per-GPU memory budget from pdctl.plan, as findings."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import tuning_key
from pdctl.plan import Budget, InstancePlan, Verdict, plan_instance
from pdctl.spec import Deployment


def _plans(dep: Deployment, verdict: Verdict) -> Iterator[tuple[InstancePlan, Budget]]:
    for inst in dep.instances:
        plan = plan_instance(inst, dep)
        if plan.budget is not None and plan.budget.verdict is verdict:
            yield plan, plan.budget


def _outside(b: Budget) -> str:
    g = b.gpu
    return (
        f"outside the static pool {b.outside_gib:.1f} GiB, needed {b.needed_outside_gib:.1f} GiB "
        f"(runtime {g.runtime_overhead_gib:g} + activations {g.activation_peak_gib:g} + "
        f"graphs {g.graph_pool_gib(b.graph_bs):.1f} for batch {b.graph_bs})"
    )


def _fix(dep: Deployment, plan: InstancePlan) -> str:
    role = plan.instance.role
    options = []
    if plan.max_safe_fraction is not None:
        options.append(f"{tuning_key(dep, role, 'mem_fraction_static')}: {plan.max_safe_fraction}")
    if plan.max_safe_graph_bs is not None and plan.graph_bs:
        graphs = f"{tuning_key(dep, role, 'cuda_graph_max_bs')} (and cuda_graph_bs)"
        options.append(f"{graphs} <= {plan.max_safe_graph_bs}")
    return " or ".join(options) or "fewer weights per GPU (a larger tp) or a larger GPU"


@rule("memory-weights", Severity.ERROR, "the weights fill the static pool: no room for a KV cache")
def memory_weights(dep: Deployment) -> Iterator[Problem]:
    for plan, b in _plans(dep, Verdict.NO_KV_POOL):
        yield Problem(
            where=plan.instance.id,
            message=f"static pool {b.static_gib:.1f} GiB ({b.mem_fraction:g} of "
            f"{b.gpu.gpu_gib:.1f}) does not exceed the weights {b.gpu.weights_gib:g} GiB: "
            "SGLang refuses to start without a KV pool",
            fix=_fix(dep, plan),
        )


@rule("memory-oom", Severity.ERROR, "graph capture will not fit outside the static pool")
def memory_oom(dep: Deployment) -> Iterator[Problem]:
    for plan, b in _plans(dep, Verdict.GRAPH_OOM):
        yield Problem(
            where=plan.instance.id,
            message=f"{_outside(b)}: CUDA-graph capture runs out of memory at start, as the "
            "seed's 0.85 with graph max batch 32 did",
            fix=_fix(dep, plan),
        )


@rule("memory-tight", Severity.WARNING, "less than the safety margin left outside the static pool")
def memory_tight(dep: Deployment) -> Iterator[Problem]:
    for plan, b in _plans(dep, Verdict.TIGHT):
        yield Problem(
            where=plan.instance.id,
            message=f"{_outside(b)}: only {b.headroom_gib:.2f} GiB to spare; a fragmentation "
            "spike or a larger NCCL buffer turns this into an OOM at graph capture",
            fix=_fix(dep, plan),
        )


@rule(
    "memory-fraction-unset",
    Severity.WARNING,
    "mem_fraction_static left to SGLang: budget unchecked",
)
def memory_fraction_unset(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        if inst.tuning.mem_fraction_static is None:
            safe = plan_instance(inst, dep).max_safe_fraction
            yield Problem(
                where=inst.id,
                message="mem_fraction_static is unset: SGLang derives one without knowing the "
                "graph sizes, and the budget that predicts an OOM at graph capture (the seed's "
                "0.85) cannot be checked",
                fix=f"{tuning_key(dep, inst.role, 'mem_fraction_static')}: "
                f"{safe if safe is not None else 'see pdctl plan'}",
            )
