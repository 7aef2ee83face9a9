"""What a prefill and a decode must agree on beyond the KV format (pairing.py), and the flags
only one role reads. Each table entry and rule mirrors one check of sglang 0.5.23
(srt/disaggregation/, srt/arg_groups/); docs/spec.md lists them with SGLang's symptom."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pdctl.lint.family import is_deepseek_v4
from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import tuning_key
from pdctl.lint.pairing import handovers
from pdctl.lint.settings import ALLOCATION, Env, Flags, env_switch, flag, settings, truthy
from pdctl.render import environment
from pdctl.spec import Deployment, Role

# SpeculativeAlgorithm.carries_draft_hidden_states (is_eagle; server args map NEXTN to EAGLE).
EAGLE_FAMILY = {"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"}
COMMON_ARGS = "engine.common.extra_args"
MASK = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"


def _mask_tokens(f: Flags, env: Env) -> str | None:
    # Compared only where both sides send masks; the switch itself is MASK's entry.
    on = truthy(env.get(MASK))
    return flag("--sampling-mask-max-tokens", "default")(f, env) if on else None


def _draft_model(f: Flags, env: Env) -> str | None:
    algorithm = flag("--speculative-algorithm", "none")(f, env).upper()
    eagle = algorithm in EAGLE_FAMILY
    return flag("--speculative-draft-model-path", "(unset)")(f, env) if eagle else None


def _mooncake_transport(f: Flags, env: Env) -> str | None:
    # mooncake_tcp only setdefault()s MC_FORCE_TCP (pd_disaggregation_hook), so the env wins.
    backend = flag("--disaggregation-transfer-backend", "mooncake")(f, env)
    if backend not in ("mooncake", "mooncake_tcp"):
        return None
    force = env.get("MC_FORCE_TCP", "1" if backend == "mooncake_tcp" else None)
    return "tcp" if truthy(force) else "rdma"


@dataclass(frozen=True)
class Shared:
    """A setting both roles must hold equal: how to read it, what SGLang does otherwise."""

    label: str  # how a message names it
    read: Callable[[Flags, Env], str | None]  # None: not compared on this side
    symptom: str
    fix: str
    choices: tuple[str, ...] = ()  # an enum flag's values; others are a usage error
    same: Callable[[str], object] = str  # the part of a value SGLang compares


KV_LAYOUT = Shared(
    "--dsv4-attn-backend / SGLANG_DSV4_KV_LAYOUT",
    lambda f, env: (
        f"{flag('--dsv4-attn-backend', 'default')(f, env)} / "
        f"{env.get('SGLANG_DSV4_KV_LAYOUT', 'v4')}"
    ),
    "for DeepSeek-V4 the two publish different kv_layouts and the decode raises 'KV layout "
    "mismatch' at its first request and dies "
    "(common/conn.py CommonKVManager.try_ensure_parallel_info)",
    f"{COMMON_ARGS} and engine.common.env.SGLANG_DSV4_KV_LAYOUT: set both once for both roles",
)
MISMATCH_ERRORS = (
    Shared(
        ALLOCATION,
        flag(ALLOCATION, "early"),
        "the decode fails every request when it first talks to the prefill "
        "(common/conn.py CommonKVReceiver.init)",
        f"{COMMON_ARGS}: set {ALLOCATION} once there; drop it from engine.prefill / "
        "engine.decode extra_args",
        choices=("early", "prefill_complete"),
    ),
    Shared(
        "--enable-unified-memory",
        flag("--enable-unified-memory"),
        "Mooncake fails every transfer with 'PD KV layout mismatch on the whole-envelope path' "
        "(mooncake/conn.py MooncakeKVManager)",
        f"{COMMON_ARGS}: set --enable-unified-memory there or on neither role",
    ),
    Shared(
        MASK,
        env_switch(MASK),
        "the two register different numbers of metadata buffers, which pair up by position: "
        "the decode reads the bootstrap room from the wrong buffer and fails or strands requests "
        "(common/conn.py check_peer_aux_buffer_count, decode.py DecodeTransferQueue)",
        f"engine.common.env.{MASK}: set it once for both roles",
    ),
    Shared(
        "--sampling-mask-max-tokens (with sampling masks on)",
        _mask_tokens,
        "the mask buffers differ in item size and the prefill writes at offsets the decode does "
        "not read (mooncake/conn.py and nixl/conn.py send_aux; arg_groups/validation_hook.py)",
        f"{COMMON_ARGS}: set --sampling-mask-max-tokens once for both roles",
    ),
    Shared(
        "--speculative-algorithm (EAGLE family carries draft hidden states)",
        flag("--speculative-algorithm", "none"),
        "the hidden-state metadata buffer is sized by the draft model on one side and 16 floats "
        "on the other, and the prefill writes at offsets the decode does not read "
        "(managers/scheduler.py MetadataBuffers set-up; mooncake/conn.py send_aux)",
        f"{COMMON_ARGS}: set --speculative-algorithm (and its draft model) once for both roles",
        same=lambda v: v.upper() in EAGLE_FAMILY,
    ),
)
DIFFERS_WARNINGS = (
    Shared(
        "--disaggregation-enable-kv-checksum",
        flag("--disaggregation-enable-kv-checksum"),
        "only one side checksums, so the decode admits every request unverified and logs a "
        "metadata-buffer count error per registration (decode.py _kv_checksum_comparable, "
        "common/conn.py check_peer_aux_buffer_count)",
        f"{COMMON_ARGS}: set --disaggregation-enable-kv-checksum there or on neither role",
    ),
    Shared(
        "--speculative-draft-model-path (EAGLE family)",
        _draft_model,
        "the hidden-state metadata buffer is sized from each side's draft model config: two "
        "draft models of different hidden sizes misplace it (managers/scheduler.py)",
        f"{COMMON_ARGS}: set --speculative-draft-model-path once for both roles",
    ),
    Shared(
        "Mooncake transport (--disaggregation-transfer-backend mooncake_tcp / MC_FORCE_TCP)",
        _mooncake_transport,
        "one side installs Mooncake's TCP transport and the other RDMA "
        "(arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation); transfers between "
        "them are Mooncake's to refuse, not SGLang's to check",
        "engine.transfer_backend and engine.common.env.MC_FORCE_TCP: set them once for both",
    ),
)


def _compare(dep: Deployment, table: tuple[Shared, ...]) -> Iterator[Problem]:
    for group, (a, first), (b, other) in handovers(dep):
        sides = [(settings(i, dep), environment(i, dep)) for i in (first, other)]
        for s in table:
            va, vb = (s.read(f, env) for f, env in sides)
            if va is None or vb is None:
                continue
            bad = [v for v in (va, vb) if s.choices and v not in s.choices]
            if bad or s.same(va) != s.same(vb):
                effect = (
                    f"{bad[0]} is not one of {', '.join(s.choices)}, so launch_server exits "
                    "with a usage error"
                    if bad
                    else s.symptom
                )
                yield Problem(
                    where=group.id,
                    message=f"{s.label} is {va} on {a} {'but' if va != vb else 'and'} {vb} on {b}: "
                    f"{effect}",
                    fix=s.fix,
                )


@rule(
    "pair-setting-mismatch",
    Severity.ERROR,
    "prefill and decode differ in a setting SGLang's handover requires equal",
)
def pair_setting_mismatch(dep: Deployment) -> Iterator[Problem]:
    yield from _compare(dep, MISMATCH_ERRORS + ((KV_LAYOUT,) if is_deepseek_v4(dep) else ()))


@rule(
    "pair-setting-differs",
    Severity.WARNING,
    "prefill and decode differ in a setting SGLang does not check, or the model decides",
)
def pair_setting_differs(dep: Deployment) -> Iterator[Problem]:
    # Without a DeepSeek-V4 model kv_layout is None on both sides and the flags do nothing;
    # an unnamed family may still be one.
    unnamed = not is_deepseek_v4(dep) and not dep.profile.model.family
    yield from _compare(dep, DIFFERS_WARNINGS + ((KV_LAYOUT,) if unnamed else ()))


@dataclass(frozen=True)
class RoleFlag:
    """A flag only one role reads; `refused` says which values stop the other from starting."""

    role: Role
    check: str  # SGLang's function that reads or refuses it
    refused: Callable[[str], bool] = lambda _value: False


_DECODE_READS = "arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation (decode only)"
_DECODE_PY = "disaggregation/decode.py"
_GRAPHS = "arg_groups/cuda_graph_hook.py apply_cuda_graph_disaggregation_roles"
ROLE_FLAGS = {
    "--disaggregation-decode-enable-offload-kvcache": RoleFlag(
        Role.DECODE, "arg_groups/kv_cache_hook.py", lambda _v: True
    ),
    "--disaggregation-decode-retraction-backup": RoleFlag(
        Role.DECODE, "arg_groups/kv_cache_hook.py handle_cache_compatibility",
        lambda v: v == "host_pool",
    ),
    "--enable-kv-cache-sharding": RoleFlag(
        Role.PREFILL, "arg_groups/kv_shard_hook.py", lambda _v: True
    ),
    "--disaggregation-decode-enable-radix-cache": RoleFlag(Role.DECODE, _DECODE_READS),
    "--disaggregation-decode-extra-slots": RoleFlag(Role.DECODE, _DECODE_READS),
    "--disaggregation-decode-polling-interval": RoleFlag(Role.DECODE, _DECODE_PY),
    "--disaggregation-decode-host-receive-threshold": RoleFlag(Role.DECODE, _DECODE_PY),
    "--num-reserved-decode-tokens": RoleFlag(Role.DECODE, _DECODE_PY),
    "--cuda-graph-max-bs-decode": RoleFlag(Role.DECODE, _GRAPHS),
    "--cuda-graph-bs-decode": RoleFlag(Role.DECODE, _GRAPHS),
    "--cuda-graph-max-bs-prefill": RoleFlag(Role.PREFILL, _GRAPHS),
    "--cuda-graph-bs-prefill": RoleFlag(Role.PREFILL, _GRAPHS),
    "--optimistic-prefill-attempts": RoleFlag(Role.PREFILL, "disaggregation/prefill.py"),
}  # fmt: skip


def _misplaced(dep: Deployment, refused: bool) -> Iterator[Problem]:
    for inst in dep.instances:
        for name, values in settings(inst, dep).items():
            spec, value = ROLE_FLAGS.get(name), " ".join(values)
            if spec is None or inst.role is spec.role or spec.refused(value) is not refused:
                continue
            shown = f"{name} {value}".strip()
            effect = "refuses to start" if refused else "ignores it"
            yield Problem(
                where=inst.id,
                message=f"{shown} is read by a {spec.role.value} only: this {inst.role.value} "
                f"{effect} ({spec.check})",
                fix=f"{tuning_key(dep, inst.role, 'extra_args')}: move {name} to "
                f"engine.{spec.role.value}.extra_args",
            )


@rule("role-flag-refused", Severity.ERROR, "a flag of one role that stops the other starting")
def role_flag_refused(dep: Deployment) -> Iterator[Problem]:
    yield from _misplaced(dep, refused=True)


@rule("role-flag-ignored", Severity.WARNING, "a flag only the other role reads")
def role_flag_ignored(dep: Deployment) -> Iterator[Problem]:
    yield from _misplaced(dep, refused=False)
