"""The memory planner reproduces the seed deployment's history with the default calibration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pdctl.plan import (
    GRAPH_BS_CAP,
    TIGHT_MARGIN_GIB,
    GpuModel,
    Verdict,
    budget,
    largest_graph_bs,
    max_safe_fraction,
    max_safe_graph_bs,
    plan_instance,
)
from pdctl.spec import Deployment, Role, Tuning
from pdctl.spec.profile import Planner

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]

CAL = Planner()
# RTX PRO 6000 Blackwell (97887 MiB), DeepSeek-V4-Flash NVFP4 at TP4, context capped at 8192.
SEED = GpuModel(
    gpu_gib=97887 / 1024,
    weights_gib=34.0,
    kv_bytes_per_token=15900,
    context_length=8192,
    runtime_overhead_gib=CAL.runtime_overhead_gib,
    activation_peak_gib=CAL.activation_peak_gib,
    graph_gib_per_batch=CAL.graph_gib_per_batch,
)


@pytest.mark.parametrize(
    ("fraction", "graph_bs", "verdict"),
    [
        (0.85, 32, Verdict.GRAPH_OOM),  # crashed at graph capture
        (0.70, 32, Verdict.FITS),  # ran safely
        (0.60, 64, Verdict.FITS),  # chosen to capture graphs up to 64
        (0.60, 96, Verdict.FITS),  # the shipped reference profile, in production
    ],
)
def test_seed_history(fraction: float, graph_bs: int, verdict: Verdict) -> None:
    assert budget(SEED, fraction, graph_bs).verdict is verdict


def test_budget_arithmetic() -> None:
    b = budget(SEED, 0.60, 96)
    assert b.static_gib == pytest.approx(0.60 * 95.593, abs=0.01)
    assert b.kv_pool_gib == pytest.approx(b.static_gib - 34.0)
    assert b.kv_tokens == int(b.kv_pool_gib * 1024**3 // 15900)
    assert b.sequences == pytest.approx(b.kv_tokens / 8192)
    assert b.outside_gib == pytest.approx(95.593 - b.static_gib, abs=0.01)
    assert b.needed_outside_gib == pytest.approx(3.5 + 4.0 + 0.3 * 96)
    assert b.headroom_gib == pytest.approx(1.94, abs=0.01)


def test_verdicts_tight_and_no_kv_pool() -> None:
    assert budget(SEED, 0.61, 96).verdict is Verdict.TIGHT  # headroom 0.98 < margin
    assert budget(SEED, 0.30, 0).verdict is Verdict.NO_KV_POOL  # 28.7 GiB static < weights
    assert budget(SEED, 0.30, 0).kv_tokens == 0
    no_context = GpuModel(**{**SEED.__dict__, "context_length": None})
    assert budget(no_context, 0.6, 0).sequences is None


def test_max_safe_fraction_is_safe_and_maximal() -> None:
    for bs in (0, 32, 64, 96):
        f = max_safe_fraction(SEED, bs)
        assert f is not None
        assert budget(SEED, f, bs).headroom_gib >= TIGHT_MARGIN_GIB
        assert budget(SEED, round(f + 0.01, 2), bs).headroom_gib < TIGHT_MARGIN_GIB
    assert max_safe_fraction(SEED, 32) == 0.81
    assert max_safe_fraction(SEED, 96) == 0.60
    assert max_safe_fraction(SEED, 300) is None  # no fraction leaves room for weights too


def test_max_safe_graph_bs_is_safe_and_maximal() -> None:
    assert max_safe_graph_bs(SEED, 0.85) == 19
    assert max_safe_graph_bs(SEED, 0.70) == 67
    assert max_safe_graph_bs(SEED, 0.60) == 99
    for f in (0.6, 0.7, 0.85):
        bs = max_safe_graph_bs(SEED, f)
        assert bs is not None
        assert budget(SEED, f, bs).verdict is Verdict.FITS
        assert budget(SEED, f, bs + 1).verdict is not Verdict.FITS
    assert max_safe_graph_bs(SEED, 0.95) is None  # not even without graphs
    free_graphs = GpuModel(**{**SEED.__dict__, "graph_gib_per_batch": 0.0})
    assert max_safe_graph_bs(free_graphs, 0.6) == GRAPH_BS_CAP


@pytest.mark.parametrize(
    ("tuning", "largest"),
    [
        (Tuning(), 0),  # prefill without graph settings
        (Tuning(cuda_graph_max_bs=32), 32),
        (Tuning(cuda_graph_bs=[1, 8, 48]), 48),
        (Tuning(cuda_graph_max_bs=32, cuda_graph_bs=[1, 64]), 64),
        (Tuning(cuda_graph_max_bs=32, disable_cuda_graph=True), 0),
    ],
)
def test_largest_graph_bs(tuning: Tuning, largest: int) -> None:
    assert largest_graph_bs(tuning) == largest


def test_shipped_reference_profile(load: Load, shipped: Shipped) -> None:
    dep = load(shipped("reference"))
    plans = {p.instance.role: p for p in (plan_instance(i, dep) for i in dep.instances)}
    decode, prefill = plans[Role.DECODE], plans[Role.PREFILL]
    assert decode.graph_bs == 96 and decode.budget is not None
    assert decode.budget.verdict is Verdict.FITS
    assert decode.budget.headroom_gib == pytest.approx(1.94, abs=0.01)
    assert prefill.graph_bs == 0 and not prefill.fails


def test_what_ifs_replace_profile_values(load: Load, shipped: Shipped) -> None:
    dep = load(shipped("reference"))
    decode = next(i for i in dep.instances if i.role is Role.DECODE)
    p = plan_instance(decode, dep, mem_fraction=0.85, graph_bs=32)
    assert p.budget is not None and p.budget.verdict is Verdict.GRAPH_OOM and p.fails
    bigger = plan_instance(decode, dep, gpu_memory_mib=2 * 97887, weights_gib=10.0)
    assert bigger.gpu.gpu_gib == pytest.approx(2 * 95.593, abs=0.01)
    assert bigger.gpu.weights_gib == 10.0
    assert plan_instance(decode, dep, kv_bytes_per_token=1).gpu.kv_bytes_per_token == 1


def test_unset_fraction_has_no_budget_but_a_safe_value(load: Load, shipped: Shipped) -> None:
    profile = shipped("reference")
    del profile["engine"]["common"]["mem_fraction_static"]
    dep = load(profile)
    decode = next(i for i in dep.instances if i.role is Role.DECODE)
    p = plan_instance(decode, dep)
    assert p.budget is None and not p.fails
    assert p.max_safe_fraction == 0.60 and p.max_safe_graph_bs is None
