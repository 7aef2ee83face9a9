"""Per-GPU memory budget: will the weights, the KV pool and the CUDA graphs fit?

SGLang gives `--mem-fraction-static` of GPU memory to weights + KV pool; everything else
(CUDA context, NCCL buffers, activations, the CUDA-graph pool) must fit in the rest. The seed
deployment crashed at graph capture with 0.85 and graph max batch 32; the defaults in
`Profile.planner` are calibrated so this model reproduces that history (tests/unit/test_plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from pdctl.spec import Deployment, Instance, Tuning

GIB = 1024**3
# Under this much headroom outside the static pool a fragmentation spike or a bigger NCCL
# buffer tips graph capture over; the calibration itself is only good to about a GiB.
TIGHT_MARGIN_GIB = 1.0
# Reported as the largest safe graph batch when graphs cost nothing (graph_gib_per_batch 0).
GRAPH_BS_CAP = 1024
FRACTION_STEP = 0.01


class Verdict(StrEnum):
    FITS = "fits"
    TIGHT = "tight"
    GRAPH_OOM = "oom-at-graph-capture"
    NO_KV_POOL = "weights-do-not-fit"


FAILING = (Verdict.GRAPH_OOM, Verdict.NO_KV_POOL)


@dataclass(frozen=True)
class GpuModel:
    """One instance's GPU: all that the two knobs (fraction, graph batch) don't change."""

    gpu_gib: float
    weights_gib: float
    kv_bytes_per_token: int
    context_length: int | None
    runtime_overhead_gib: float
    activation_peak_gib: float
    graph_gib_per_batch: float

    def needed_outside_gib(self, graph_bs: int) -> float:
        return self.runtime_overhead_gib + self.activation_peak_gib + self.graph_pool_gib(graph_bs)

    def graph_pool_gib(self, graph_bs: int) -> float:
        return self.graph_gib_per_batch * graph_bs


@dataclass(frozen=True)
class Budget:
    gpu: GpuModel
    mem_fraction: float
    graph_bs: int
    static_gib: float
    kv_pool_gib: float
    kv_tokens: int
    sequences: (
        float | None
    )  # full-context sequences the KV pool holds; None without a context length
    outside_gib: float
    needed_outside_gib: float
    headroom_gib: float
    verdict: Verdict


def budget(gpu: GpuModel, mem_fraction: float, graph_bs: int) -> Budget:
    static = mem_fraction * gpu.gpu_gib
    kv_pool = static - gpu.weights_gib
    kv_tokens = max(0, int(kv_pool * GIB // gpu.kv_bytes_per_token))
    outside = gpu.gpu_gib - static
    needed = gpu.needed_outside_gib(graph_bs)
    headroom = outside - needed
    if kv_pool <= 0:
        verdict = Verdict.NO_KV_POOL
    elif headroom < 0:
        verdict = Verdict.GRAPH_OOM
    elif headroom < TIGHT_MARGIN_GIB:
        verdict = Verdict.TIGHT
    else:
        verdict = Verdict.FITS
    return Budget(
        gpu=gpu,
        mem_fraction=mem_fraction,
        graph_bs=graph_bs,
        static_gib=static,
        kv_pool_gib=kv_pool,
        kv_tokens=kv_tokens,
        sequences=kv_tokens / gpu.context_length if gpu.context_length else None,
        outside_gib=outside,
        needed_outside_gib=needed,
        headroom_gib=headroom,
        verdict=verdict,
    )


def max_safe_fraction(gpu: GpuModel, graph_bs: int) -> float | None:
    """Largest fraction (0.01 steps) leaving the margin outside; None if then no KV pool."""
    limit = 1 - (gpu.needed_outside_gib(graph_bs) + TIGHT_MARGIN_GIB) / gpu.gpu_gib
    fraction = round(math.floor(limit / FRACTION_STEP + 1e-9) * FRACTION_STEP, 2)
    if fraction * gpu.gpu_gib <= gpu.weights_gib:
        return None
    return fraction


def max_safe_graph_bs(gpu: GpuModel, mem_fraction: float) -> int | None:
    """Largest graph batch leaving the margin outside; None if even no graphs leave it."""
    spare = budget(gpu, mem_fraction, 0).headroom_gib - TIGHT_MARGIN_GIB
    if spare < 0:
        return None
    if gpu.graph_gib_per_batch == 0:
        return GRAPH_BS_CAP
    return min(GRAPH_BS_CAP, math.floor(spare / gpu.graph_gib_per_batch + 1e-9))


def largest_graph_bs(t: Tuning) -> int:
    """The largest batch SGLang captures from these settings; 0 without graphs or settings."""
    if t.disable_cuda_graph:
        return 0
    return max([*(t.cuda_graph_bs or []), t.cuda_graph_max_bs or 0])


def gpu_model(
    inst: Instance,
    dep: Deployment,
    *,
    gpu_memory_mib: int | None = None,
    weights_gib: float | None = None,
    kv_bytes_per_token: int | None = None,
) -> GpuModel:
    """The instance's GPU from its host's hardware and the profile; keywords are what-ifs."""
    p = dep.profile
    hardware = next(h.hardware for h in dep.hosts if h.name == inst.host)
    return GpuModel(
        gpu_gib=(gpu_memory_mib or hardware.gpu_memory_mib) / 1024,
        weights_gib=weights_gib or p.model.weights_gib_per_gpu,
        kv_bytes_per_token=kv_bytes_per_token or p.model.kv_bytes_per_token,
        context_length=inst.tuning.context_length or p.model.native_context_length,
        runtime_overhead_gib=p.planner.runtime_overhead_gib,
        activation_peak_gib=p.planner.activation_peak_gib,
        graph_gib_per_batch=p.planner.graph_gib_per_batch,
    )


@dataclass(frozen=True)
class InstancePlan:
    """An instance's budget at its settings (or what-ifs) and the safe limits around them."""

    instance: Instance
    gpu: GpuModel
    graph_bs: int
    budget: Budget | None  # None while mem_fraction_static is unset
    max_safe_fraction: float | None  # for graph_bs
    max_safe_graph_bs: int | None  # at the fraction; None if no fraction or no graphs fit

    @property
    def fails(self) -> bool:
        return self.budget is not None and self.budget.verdict in FAILING


def plan_instance(
    inst: Instance,
    dep: Deployment,
    *,
    mem_fraction: float | None = None,
    graph_bs: int | None = None,
    gpu_memory_mib: int | None = None,
    weights_gib: float | None = None,
    kv_bytes_per_token: int | None = None,
) -> InstancePlan:
    """Plan one instance; every keyword replaces the profile's value (a what-if)."""
    gpu = gpu_model(
        inst,
        dep,
        gpu_memory_mib=gpu_memory_mib,
        weights_gib=weights_gib,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    bs = largest_graph_bs(inst.tuning) if graph_bs is None else graph_bs
    fraction = inst.tuning.mem_fraction_static if mem_fraction is None else mem_fraction
    return InstancePlan(
        instance=inst,
        gpu=gpu,
        graph_bs=bs,
        budget=None if fraction is None else budget(gpu, fraction, bs),
        max_safe_fraction=max_safe_fraction(gpu, bs),
        max_safe_graph_bs=None if fraction is None else max_safe_graph_bs(gpu, fraction),
    )
