"""An instance's SGLang settings as SGLang resolves them from the rendered launch line: the
flags under their canonical names, and the parallel layout its disaggregation code publishes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdctl.lint.flags import known_flags
from pdctl.lint.launch_line import flag_values
from pdctl.render import launch_args
from pdctl.spec import Deployment, Instance
from pdctl.spec.profile import TRUE_WORDS

Flags = dict[str, tuple[str, ...]]
Env = dict[str, str]
# sglang 0.5.23's second spellings of the flags the cross-role rules read
# (arg_groups/fields/*.py `aliases`).
ALIASES = {
    "--tensor-parallel-size": "--tp-size",
    "--data-parallel-size": "--dp-size",
    "--attention-data-parallel-size": "--attn-dp-size",
    "--attention-context-parallel-size": "--attn-cp-size",
    "--pipeline-parallel-size": "--pp-size",
    "--speculative-draft-model": "--speculative-draft-model-path",
}
ALLOCATION = "--disaggregation-decode-allocation-policy"


def settings(inst: Instance, dep: Deployment) -> Flags:
    """The launch line as flag_values reads it, each flag under the name SGLang's parser
    resolves it to: an alias, or an abbreviation argparse expands (one match only)."""
    known = known_flags(dep.profile.versions.sglang) or frozenset()
    out: Flags = {}
    for name, values in flag_values(launch_args(inst, dep)).items():
        if name not in known:
            matches = [k for k in known if k.startswith(name)]
            name = matches[0] if len(matches) == 1 else name
        out[ALIASES.get(name, name)] = values
    return out


def truthy(value: str | None) -> bool:
    """SGLang's EnvBool: true/1/yes/y, any case."""
    return (value or "").lower() in TRUE_WORDS


def flag(name: str, default: str = "off") -> Callable[[Flags, Env], str]:
    """A reader of one flag's value as SGLang takes it: the last given, `on` for a switch."""
    return lambda f, _env: (" ".join(f[name]) or "on") if name in f else default


def env_switch(name: str) -> Callable[[Flags, Env], str]:
    return lambda _f, env: "on" if truthy(env.get(name)) else "off"


def _int(f: Flags, name: str) -> int:
    """A size flag, 1 when unset or unreadable (argparse refuses the latter at start)."""
    try:
        return max(int(f[name][-1]), 1) if f.get(name) else 1
    except ValueError:
        return 1


@dataclass(frozen=True)
class Parallel:
    """What a prefill registers with its bootstrap server (common/conn.py register_to_bootstrap)
    and a decode compares against it; attention TP as runtime_context.derive_attn_tp_size."""

    tp: int
    attn_dp: int
    attn_cp: int
    pp: int
    dcp: int
    kv_sharding: bool
    policy: str
    backend: str

    @property
    def attn_tp(self) -> int:
        return max(self.tp // self.attn_dp // self.attn_cp, 1)


def parallel(inst: Instance, dep: Deployment) -> Parallel:
    f = settings(inst, dep)
    attn_dp = _int(f, "--attn-dp-size")
    if "--enable-dp-attention" in f:  # the old spelling: --dp-size N --enable-dp-attention
        attn_dp = max(attn_dp, _int(f, "--dp-size"))
    return Parallel(
        tp=_int(f, "--tp-size"),
        attn_dp=attn_dp,
        attn_cp=_int(f, "--attn-cp-size"),
        pp=_int(f, "--pp-size"),
        dcp=_int(f, "--dcp-size"),
        kv_sharding="--enable-kv-cache-sharding" in f,
        policy=flag(ALLOCATION, "early")(f, {}),
        backend=flag("--disaggregation-transfer-backend", "mooncake")(f, {}),
    )
