"""What a deployment profile gives `pdctl capacity --profile`: the engine flags it renders for
each role, held against the flags each law was measured under, and its values for the
options the user left out (an explicit option always wins).

A role's flags are those of its first engine in the profile's `layout` (hosts' own layouts
aside), rendered by the same function as its unit's command line, extra_args included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdctl.analyze.logparse import FlagValue, flag_value
from pdctl.capacity.laws import Laws
from pdctl.capacity.report import Site
from pdctl.lint.launch_line import flag_values
from pdctl.render import engine_args
from pdctl.spec import Instance, Profile, Role, load_profile
from pdctl.spec.load import layout_instances

# Switches SGLang leaves off unless given: a profile that does not render one runs without it.
# Any other flag the profile leaves out is the engine's own choice at start-up, so unknown here.
OFF_UNLESS_GIVEN: dict[str, FlagValue] = {
    "disable_cuda_graph": False,
    "speculative_algorithm": None,
}
LIST_SHOWN = 6  # longer lists are shown by their ends and length


def rendered_flags(args: list[str]) -> dict[str, FlagValue]:
    """`--tp-size 4 --disable-cuda-graph --cuda-graph-bs-decode 1 2` as ServerArgs names and
    values, typed as a start-up line's are read."""
    out: dict[str, FlagValue] = {}
    for flag, values in flag_values(args).items():
        name = flag.removeprefix("--").replace("-", "_")
        if not values:
            out[name] = True
        elif len(values) == 1:
            out[name] = flag_value(values[0].encode())
        else:
            out[name] = flag_value(f"[{', '.join(values)}]".encode())
    return out


def _same(measured: FlagValue, given: FlagValue) -> bool:
    if isinstance(measured, list) and isinstance(given, list):
        return sorted(measured) == sorted(given)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (measured, given))
    return measured == given if numbers or type(measured) is type(given) else False


def _text(value: FlagValue) -> str:
    if isinstance(value, list) and len(value) > LIST_SHOWN:
        return f"[{value[0]}, {value[1]}, …, {value[-1]}] ({len(value)} sizes)"
    return str(value)


@dataclass(frozen=True)
class Deployed:
    path: Path
    profile: Profile
    prefill: Instance
    decode: Instance

    def instance(self, role: Role) -> Instance:
        return self.prefill if role is Role.PREFILL else self.decode

    def flags(self, role: Role) -> dict[str, FlagValue]:
        return rendered_flags(engine_args(self.instance(role), self.profile))

    def gpus(self, role: Role) -> int:
        return len(self.instance(role).gpus)

    @property
    def context_length(self) -> int | None:
        return self.decode.tuning.context_length or self.prefill.tuning.context_length

    @property
    def chunked_prefill_size(self) -> int | None:
        size = self.prefill.tuning.chunked_prefill_size
        return size if size is not None and size > 0 else None  # -1 turns chunking off

    @property
    def cuda_graph_bs(self) -> list[int] | None:
        return self.decode.tuning.cuda_graph_bs or None

    def site(self, gpus_per_host: int | None) -> Site:
        """The snippet's host shape, first ports and NUMA map: the profile's."""
        layout = layout_instances("", "", self.profile.layout, self.profile)
        hardware = self.profile.hardware
        return Site(
            gpus_per_host or hardware.gpu_count,
            min(i.port for i in layout),
            min(i.bootstrap_port for i in layout if i.bootstrap_port is not None),
            hardware.numa_gpus,
        )


def load_deployed(path: Path) -> Deployed:
    """The profile through the loader `pdctl validate` uses: a bad one is one SpecError line."""
    profile = load_profile(path)
    instances = layout_instances("", "", profile.layout, profile)
    first = {role: next(i for i in instances if i.role is role) for role in Role}
    return Deployed(path, profile, first[Role.PREFILL], first[Role.DECODE])


def profile_warnings(laws: Laws, deployed: Deployed, gpus: dict[Role, int]) -> list[str]:
    """A line per flag a law was measured under that the profile renders otherwise for the
    law's role; one per law without flags. `gpus`: the layout's GPUs per engine, whose own
    warning (search.flag_warnings) already says a tp_size that differs from them."""
    out = []
    sides = (
        (Role.DECODE, laws.decode_flags, laws.decode_source),
        (Role.PREFILL, laws.prefill_flags, laws.prefill_source),
    )
    for role, measured, source in sides:
        if not measured:
            out.append(
                f"the {role} law ({source}) names no engine flags (no start-up lines in its "
                f"journal): whether {deployed.path}'s {role} runs as it was measured is unknown"
            )
            continue
        given = OFF_UNLESS_GIVEN | deployed.flags(role)
        for name, value in sorted(measured.items()):
            if name not in given or _same(value, given[name]):
                continue
            if name == "tp_size" and given[name] == gpus[role]:
                continue
            out.append(
                f"the {role} law ({source}) was measured with {name}={_text(value)}; "
                f"{deployed.path} gives its {role} {name}={_text(given[name])}"
            )
    return out
