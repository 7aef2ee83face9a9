"""A pair or group is a unit: its prefills and decodes agree on everything the KV handover
depends on, and the gateway keeps every request inside one pair or group."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import instance_key
from pdctl.lint.launch_line import flag_values
from pdctl.lint.settings import parallel
from pdctl.render import environment, launch_args, router_args
from pdctl.spec import Deployment, Instance
from pdctl.spec.deployment import Group

# Decode checks page size and kv dtype against prefill's registration and raises; a context
# cap on one side only made decodes wait forever in a public report.
SHARED_FLAGS = {
    "--model-path": "model.path",
    "--served-model-name": "model.served_name",
    "--page-size": "engine.common.page_size",
    "--kv-cache-dtype": "engine.common.kv_cache_dtype",
    "--context-length": "engine.common.context_length",
    "--disaggregation-transfer-backend": "engine.transfer_backend",
}
TIMEOUT_ENV_PREFIX = "SGLANG_DISAGGREGATION_"


def handovers(
    dep: Deployment,
) -> Iterator[tuple[Group, tuple[str, Instance], tuple[str, Instance]]]:
    """Per pair or group, every other member against its first prefill, each with the label a
    message gives it. The tuning is per role, so one reference finds any member that differs."""
    for group in dep.groups():
        first, *rest = group.instances
        for other in rest:
            yield group, (_label(group, first), first), (_label(group, other), other)


def _label(group: Group, inst: Instance) -> str:
    """A pair's sides are `prefill` and `decode`; a group's members go by their names."""
    return inst.role.value if group.is_pair else inst.name


@rule(
    "pair-mismatch",
    Severity.ERROR,
    "prefill and decode differ in model, page size, kv dtype, context or backend",
)
def pair_mismatch(dep: Deployment) -> Iterator[Problem]:
    for group, (a, first), (b, other) in handovers(dep):
        p, d = flag_values(launch_args(first, dep)), flag_values(launch_args(other, dep))
        for flag, key in SHARED_FLAGS.items():
            if p.get(flag) != d.get(flag):
                shown = [" ".join(v[flag]) if flag in v else "(unset)" for v in (p, d)]
                yield Problem(
                    where=group.id,
                    message=f"{flag} is {shown[0]} on {a} but {shown[1]} on {b}: "
                    "the KV handover needs both sides equal",
                    fix=f"{key}: set it once there; drop {flag} from engine.prefill / "
                    "engine.decode (their keys and extra_args)",
                )


@rule(
    "pair-timeout-mismatch",
    Severity.WARNING,
    "prefill and decode differ in SGLANG_DISAGGREGATION_* env",
)
def pair_timeout_mismatch(dep: Deployment) -> Iterator[Problem]:
    for group, (a, first), (b, other) in handovers(dep):
        p, d = environment(first, dep), environment(other, dep)
        names = sorted(k for k in p.keys() | d.keys() if k.startswith(TIMEOUT_ENV_PREFIX))
        for name in names:
            if p.get(name) != d.get(name):
                yield Problem(
                    where=group.id,
                    message=f"{name} is {p.get(name, '(default)')} on {a} but "
                    f"{d.get(name, '(default)')} on {b}: one side gives up on a handover "
                    "the other still waits for, and a stuck request holds KV until the longer one",
                    fix=f"engine.common.env.{name}: set it once for both roles",
                )


POLICY_FLAGS = {"prefill": "--prefill-policy", "decode": "--decode-policy"}


@rule(
    "pair-routing",
    Severity.ERROR,
    "several pairs behind a gateway whose routing does not keep requests inside pairs",
)
def pair_routing(dep: Deployment) -> Iterator[Problem]:
    pairs = dep.groups()
    # A group with several members of a role relies on the pairing protocol alone: no
    # rotation lines its members up, and counts of 1P1D units are what this rule compares.
    if len(pairs) < 2 or not all(g.is_1p1d for g in pairs):
        return
    args = router_args(dep)
    flags = flag_values(args)
    # smg takes the last --policy; --prefill-policy / --decode-policy override it per side.
    main = flags["--policy"][0]
    policies = {side: (flags.get(flag) or (main,))[0] for side, flag in POLICY_FLAGS.items()}
    # The gateway unit registers each pair's prefill and decode; router.extra_args may add more.
    counts = {side: len(pairs) + args.count(f"--{side}") for side in POLICY_FLAGS}
    if set(policies.values()) == {"round_robin"} and counts["prefill"] == counts["decode"]:
        return
    found = ", ".join(f"{side} {policies[side]} over {counts[side]}" for side in POLICY_FLAGS)
    yield Problem(
        where="profile",
        message=f"{len(pairs)} pairs, gateway routing {found}: smg picks a prefill and a decode "
        "for each request separately. Requests that cross pairs break the pair as the unit of "
        "restart (a restarted decode leaves stale state in every prefill that served it, and "
        "pdctl restart --both clears only its own pair) and, without RDMA, move KV between "
        "hosts over TCP. pdctl binds each pair's workers when it registers them (the gateway "
        "unit does at every start); workers added another way are unbound, and only "
        "round_robin on both sides over equal counts can keep prefill i with decode i",
        fix="router.policy: round_robin; drop --policy, --prefill-policy, --decode-policy, "
        "--prefill and --decode from router.extra_args",
    )


@rule(
    "group-tp-ratio",
    Severity.ERROR,
    "a prefill's and a decode's tp of one group that are not multiples of one another",
)
def group_tp_ratio(dep: Deployment) -> Iterator[Problem]:
    # SGLang 0.5.23 lets a group's prefills and decodes differ in TP size: the decode maps its
    # ranks onto the prefill's in CommonKVReceiver._resolve_rank_mapping
    # (srt/disaggregation/common/conn.py) by integer division of the larger attention TP size
    # by the smaller, so the two must divide. Members of one role may differ freely: a decode
    # resolves each prefill's layout separately (prefill_info_table per bootstrap address).
    for group in dep.groups():
        for p in group.prefills:
            for d in group.decodes:
                # Attention TP: TP over attention DP and CP (settings.Parallel.attn_tp).
                pt, dt = parallel(p, dep).attn_tp, parallel(d, dep).attn_tp
                if max(pt, dt) % min(pt, dt):
                    yield Problem(
                        where=group.id,
                        message=f"{p.name} runs attention tp {pt} and {d.name} {dt}: SGLang "
                        "maps a decode's TP ranks onto a prefill's by dividing one size by the "
                        "other, so KV from one cannot land on the other",
                        fix=f"{instance_key(dep, d, 'gpus')} or {instance_key(dep, p, 'gpus')}"
                        ": make one tp a multiple of the other (equal is simplest)",
                    )
