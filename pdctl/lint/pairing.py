"""A pair is a unit: its prefill and decode agree on everything the KV handover depends on,
and the gateway keeps every request inside one pair."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.launch_line import flag_values
from pdctl.render import environment, launch_args, router_args
from pdctl.spec import Deployment

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


@rule(
    "pair-mismatch",
    Severity.ERROR,
    "prefill and decode differ in model, page size, kv dtype, context or backend",
)
def pair_mismatch(dep: Deployment) -> Iterator[Problem]:
    for prefill, decode in dep.pairs():
        p, d = flag_values(launch_args(prefill, dep)), flag_values(launch_args(decode, dep))
        for flag, key in SHARED_FLAGS.items():
            if p.get(flag) != d.get(flag):
                shown = [" ".join(v[flag]) if flag in v else "(unset)" for v in (p, d)]
                yield Problem(
                    where=f"{prefill.host}/{prefill.pair}",
                    message=f"{flag} is {shown[0]} on prefill but {shown[1]} on decode: "
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
    for prefill, decode in dep.pairs():
        p, d = environment(prefill, dep), environment(decode, dep)
        names = sorted(k for k in p.keys() | d.keys() if k.startswith(TIMEOUT_ENV_PREFIX))
        for name in names:
            if p.get(name) != d.get(name):
                yield Problem(
                    where=f"{prefill.host}/{prefill.pair}",
                    message=f"{name} is {p.get(name, '(default)')} on prefill but "
                    f"{d.get(name, '(default)')} on decode: one side gives up on a handover "
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
    pairs = dep.pairs()
    if len(pairs) < 2:
        return
    args = router_args(dep)
    flags = flag_values(args)
    # smg takes the last --policy; --prefill-policy / --decode-policy override it per side.
    main = flags["--policy"][0]
    policies = {side: (flags.get(flag) or (main,))[0] for side, flag in POLICY_FLAGS.items()}
    counts = {side: args.count(f"--{side}") for side in POLICY_FLAGS}
    if set(policies.values()) == {"round_robin"} and counts["prefill"] == counts["decode"]:
        return
    found = ", ".join(f"{side} {policies[side]} over {counts[side]}" for side in POLICY_FLAGS)
    yield Problem(
        where="profile",
        message=f"{len(pairs)} pairs, gateway routing {found}: smg picks a prefill and a decode "
        "for each request separately. Requests that cross pairs break the pair as the unit of "
        "restart (a restarted decode leaves stale state in every prefill that served it, and "
        "pdctl restart --both clears only its own pair) and, without RDMA, move KV between "
        "hosts over TCP. pdctl binds a pair's workers when it registers them; until then "
        "(the workers on the gateway's command line) only round_robin on both sides over "
        "equal counts can keep prefill i with decode i",
        fix="router.policy: round_robin; drop --policy, --prefill-policy, --decode-policy, "
        "--prefill and --decode from router.extra_args",
    )
