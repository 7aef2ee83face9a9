"""How a prefill's and a decode's parallel layouts combine: what the decode checks when it
first reads a prefill's layout from its bootstrap server, and what prefill_complete needs."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import tuning_key
from pdctl.lint.settings import ALLOCATION, Parallel, parallel
from pdctl.spec import Deployment, Instance, Role
from pdctl.spec.deployment import Group

# The exception leaves the decode's scheduler loop, so the whole server exits
# (managers/scheduler.py run_scheduler_process).
FIRST_CONTACT = (
    "the decode raises when it first reads the prefill's layout, at its first request, and dies"
)


def _members(dep: Deployment) -> Iterator[tuple[Group, Instance, Parallel, Instance, Parallel]]:
    """Every prefill against every decode of each pair or group, with their layouts."""
    for group in dep.groups():
        for p in group.prefills:
            for d in group.decodes:
                yield group, p, parallel(p, dep), d, parallel(d, dep)


def _layout_errors(p: Parallel, d: Parallel) -> Iterator[str]:
    # common/conn.py CommonKVManager._resolve_rank_mapping and try_ensure_parallel_info.
    if d.attn_cp != 1:
        yield f"the decode runs attention CP {d.attn_cp} (_resolve_rank_mapping asserts 1)"
    if d.pp not in (p.pp, 1):
        yield (
            f"the decode runs PP {d.pp} and the prefill PP {p.pp} (_resolve_rank_mapping "
            "asserts the decode's PP is the prefill's or 1)"
        )
    if d.dcp > 1 and p.attn_cp != 1:
        yield f"decode DCP {d.dcp} needs prefill attention CP 1, not {p.attn_cp}"
    if d.dcp > 1 and p.kv_sharding:
        yield f"decode DCP {d.dcp} does not take a prefill with --enable-kv-cache-sharding"


@rule(
    "pair-parallel-layout",
    Severity.ERROR,
    "a decode's CP, PP or DCP that the prefill's layout cannot feed",
)
def pair_parallel_layout(dep: Deployment) -> Iterator[Problem]:
    for group, p, pl, d, dl in _members(dep):
        for reason in _layout_errors(pl, dl):
            yield Problem(
                where=group.id,
                message=f"{p.name} and {d.name}: {reason}: {FIRST_CONTACT} "
                "(common/conn.py CommonKVManager.try_ensure_parallel_info)",
                fix=f"{tuning_key(dep, Role.DECODE, 'extra_args')}: decode --attn-cp-size 1, "
                "--pp-size equal to the prefill's or 1, and --dcp-size 1 unless the prefill "
                "runs attention CP 1 without --enable-kv-cache-sharding",
            )


def _prefill_complete_limits(layout: Parallel) -> Iterator[str]:
    # arg_groups/pd_disaggregation_hook.py _validate_prefill_complete.
    if layout.backend not in ("mooncake", "mooncake_tcp"):
        yield f"transfer backend {layout.backend}"
    for name, size in (("attention TP", layout.attn_tp), ("PP", layout.pp),
                       ("attention CP", layout.attn_cp), ("DCP", layout.dcp)):  # fmt: skip
        if size != 1:
            yield f"{name} {size}"


@rule(
    "prefill-complete-layout",
    Severity.ERROR,
    "allocation policy prefill_complete without Mooncake and attention TP1/PP1/CP1",
)
def prefill_complete_layout(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        layout = parallel(inst, dep)
        limits = list(_prefill_complete_limits(layout))
        if layout.policy == "prefill_complete" and limits:
            yield Problem(
                where=inst.id,
                message=f"{ALLOCATION} prefill_complete with {', '.join(limits)}: SGLang refuses "
                "to start (pd_disaggregation_hook.py _validate_prefill_complete); a prefill "
                "other than attention TP1/CP1/PP1 would fail every request of its decodes "
                "(common/conn.py CommonKVReceiver.init)",
                fix=f"{tuning_key(dep, inst.role, 'extra_args')}: {ALLOCATION} early on both "
                "roles, or engine.transfer_backend: mooncake with one GPU per instance",
            )


def _model_dependent(p: Parallel, d: Parallel) -> Iterator[str]:
    big, small = max(p.attn_tp, d.attn_tp), min(p.attn_tp, d.attn_tp)
    if big != small and big % small == 0:  # indivisible sizes are group-tp-ratio's error
        yield (
            f"attention TP {p.attn_tp} on the prefill and {d.attn_tp} on the decode: the decode "
            "raises at its first request for MiniMax sparse attention, MXFP8 KV on a non-MLA "
            "model, DeepSeek-V4.1 DSpark, or an MLA model whose prefill runs "
            "--enable-kv-cache-sharding (try_ensure_parallel_info, _resolve_rank_mapping); "
            "other non-MLA models run with a performance warning"
        )
    if d.dcp > 1:
        yield (
            f"decode DCP {d.dcp}: the decode raises at its first request unless the model has "
            "an MLA or hybrid-MLA KV pool (try_ensure_parallel_info)"
        )


@rule(
    "pair-layout-model-dependent",
    Severity.WARNING,
    "prefill and decode layouts that SGLang refuses for some models",
)
def pair_layout_model_dependent(dep: Deployment) -> Iterator[Problem]:
    for group, p, pl, d, dl in _members(dep):
        for reason in _model_dependent(pl, dl):
            yield Problem(
                where=group.id,
                message=f"{p.name} and {d.name}: {reason} (common/conn.py)",
                fix="layout: equal tp on both roles, and no --dcp-size on a decode, unless "
                "the model is known to take it",
            )
