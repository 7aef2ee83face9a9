"""CUDA-graph sizes against what the decode will actually batch."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import tuning_key
from pdctl.plan import largest_graph_bs
from pdctl.spec import Deployment, Role


@rule(
    "decode-eager-fallback",
    Severity.ERROR,
    "decode may run more requests than its largest CUDA graph",
)
def decode_eager_fallback(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        t = inst.tuning
        largest = largest_graph_bs(t)
        if inst.role is not Role.DECODE or largest == 0:
            continue
        mrr_key = tuning_key(dep, inst.role, "max_running_requests")
        incident = (
            "batches above it run eager and allocate temporaries; the seed's decode crashed "
            "this way (3.94 GiB allocation at concurrency 64 with graphs up to 32)"
        )
        if t.max_running_requests is None:
            yield Problem(
                where=inst.id,
                message=f"max_running_requests is unset while graphs stop at batch {largest}: "
                f"SGLang sizes the two independently (a known trap), so {incident}",
                fix=f"{mrr_key}: {largest} (or raise the graph sizes)",
            )
        elif t.max_running_requests > largest:
            yield Problem(
                where=inst.id,
                message=f"max_running_requests {t.max_running_requests} is above the largest "
                f"captured graph {largest}: {incident}",
                fix=f"{mrr_key}: {largest}, or {tuning_key(dep, inst.role, 'cuda_graph_max_bs')}"
                f" (and cuda_graph_bs): {t.max_running_requests}",
            )


@rule("graph-size-unset", Severity.WARNING, "decode graphs on, but their size left to SGLang")
def graph_size_unset(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        t = inst.tuning
        if inst.role is Role.DECODE and not t.disable_cuda_graph and largest_graph_bs(t) == 0:
            yield Problem(
                where=inst.id,
                message="no cuda_graph_max_bs / cuda_graph_bs: SGLang picks the graph size from "
                "the GPU, so neither the eager fallback nor the memory budget can be checked",
                fix=f"{tuning_key(dep, inst.role, 'cuda_graph_max_bs')}: the largest decode batch "
                "you expect (equal to max_running_requests)",
            )


@rule("graph-buckets-order", Severity.WARNING, "cuda_graph_bs unsorted, repeated or not positive")
def graph_buckets_order(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        buckets = inst.tuning.cuda_graph_bs or []
        expected = sorted({b for b in buckets if b > 0})
        if buckets != expected:
            yield Problem(
                where=inst.id,
                message=f"cuda_graph_bs {buckets} is not a strictly increasing list of positive "
                "sizes: a typo here usually means a missing bucket and a padded batch",
                fix=f"{tuning_key(dep, inst.role, 'cuda_graph_bs')}: {expected}",
            )


@rule(
    "graph-buckets-above-max", Severity.ERROR, "a cuda_graph_bs bucket is above cuda_graph_max_bs"
)
def graph_buckets_above_max(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        t = inst.tuning
        if t.cuda_graph_max_bs is None or not t.cuda_graph_bs:
            continue
        above = [b for b in t.cuda_graph_bs if b > t.cuda_graph_max_bs]
        if above:
            yield Problem(
                where=inst.id,
                message=f"buckets {above} are above cuda_graph_max_bs {t.cuda_graph_max_bs}: "
                "the two settings disagree on the largest graph, and so do the eager-fallback "
                "and memory checks",
                fix=f"{tuning_key(dep, inst.role, 'cuda_graph_max_bs')}: {max(t.cuda_graph_bs)}, "
                f"or drop {above} from {tuning_key(dep, inst.role, 'cuda_graph_bs')}",
            )
