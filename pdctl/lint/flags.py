"""Every launch flag checked against the option list of the pinned sglang's own parser."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources

from pdctl.lint.finding import Problem, Severity, rule
from pdctl.lint.keys import tuning_key
from pdctl.lint.launch_line import flag_values
from pdctl.render import launch_args
from pdctl.spec import Deployment, Instance

GENERATOR = "scripts/sglang-flags.py"
NOOP_FLAGS = {"--num-continuous-decode-steps": "nothing in current SGLang reads it"}


@cache
def known_flags(version: str) -> frozenset[str] | None:
    """The option strings of sglang `version`'s launch_server, or None when not shipped."""
    data = resources.files("pdctl") / "data" / f"sglang-{version}-flags.txt"
    if not data.is_file():
        return None
    lines = data.read_text().splitlines()
    return frozenset(line for line in lines if line.startswith("--"))


def matches(flag: str, known: frozenset[str]) -> list[str]:
    """The options argparse takes `flag` for: itself, else every option it abbreviates (one
    passes, several are ambiguous, none is unknown)."""
    if flag in known:
        return [flag]
    return sorted(k for k in known if k.startswith(flag))


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """The hint `(did you mean …?)` with the closest known names (difflib), or ""."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=cutoff)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def flag_source(dep: Deployment, inst: Instance, flag: str) -> str:
    """Where a flag comes from: the user's extra_args, or pdctl's own renderer."""
    if any(a.partition("=")[0] == flag for a in inst.tuning.extra_args):
        return tuning_key(dep, inst.role, "extra_args")
    return f"versions.sglang (pdctl renders {flag} itself)"


@dataclass(frozen=True)
class Refused:
    """A rendered flag a parser does not take as exactly one option."""

    inst: Instance
    flag: str
    taken: list[str]  # the options it abbreviates: none (unknown) or several (ambiguous)


def refused_flags(dep: Deployment, known: frozenset[str]) -> Iterator[Refused]:
    """Every rendered flag (extra_args included) of every instance that `known` refuses."""
    for inst in dep.instances:
        for flag in flag_values(launch_args(inst, dep)):
            taken = matches(flag, known)
            if len(taken) != 1:
                yield Refused(inst, flag, taken)


def unknown_problem(
    dep: Deployment, r: Refused, version: str, known: frozenset[str], note: str = ""
) -> Problem:
    """`note`: what else the message says about the flag, e.g. that another version takes it."""
    return Problem(
        where=r.inst.id,
        message=f"sglang {version} does not accept {r.flag}{note}{did_you_mean(r.flag, known)}: "
        "launch_server exits with a usage error",
        fix=f"{flag_source(dep, r.inst, r.flag)}: remove or rename {r.flag}",
    )


def ambiguous_problem(dep: Deployment, r: Refused, version: str) -> Problem:
    options = ", ".join(r.taken)
    return Problem(
        where=r.inst.id,
        message=f"{r.flag} is ambiguous in sglang {version}: it could be {options}, and "
        "argparse refuses to guess",
        fix=f"{flag_source(dep, r.inst, r.flag)}: spell out one of {options}",
    )


@rule("unknown-flag", Severity.ERROR, "a launch flag the pinned sglang does not accept")
def unknown_flag(dep: Deployment) -> Iterator[Problem]:
    version = dep.profile.versions.sglang
    known = known_flags(version)
    if known is None:  # flags-unchecked says so
        return
    for r in refused_flags(dep, known):
        if not r.taken:
            yield unknown_problem(dep, r, version, known)


@rule("ambiguous-flag", Severity.ERROR, "a launch flag that is a prefix of several flags")
def ambiguous_flag(dep: Deployment) -> Iterator[Problem]:
    version = dep.profile.versions.sglang
    known = known_flags(version)
    if known is None:
        return
    for r in refused_flags(dep, known):
        if r.taken:
            yield ambiguous_problem(dep, r, version)


@rule("flags-unchecked", Severity.WARNING, "no flag list for the pinned sglang version")
def flags_unchecked(dep: Deployment) -> Iterator[Problem]:
    version = dep.profile.versions.sglang
    if known_flags(version) is None:
        yield Problem(
            where="profile",
            message=f"pdctl has no flag list for sglang {version}, so launch flags are unchecked",
            fix=f"versions.sglang: a version with a list, or generate one with "
            f"`<python with sglang {version}> {GENERATOR} > pdctl/data/sglang-{version}-flags.txt`",
        )


@rule("noop-flag", Severity.WARNING, "a flag SGLang accepts but ignores")
def noop_flag(dep: Deployment) -> Iterator[Problem]:
    for inst in dep.instances:
        for flag in flag_values(list(inst.tuning.extra_args)):
            if flag in NOOP_FLAGS:
                yield Problem(
                    where=inst.id,
                    message=f"{flag} does nothing: {NOOP_FLAGS[flag]} (the seed tried "
                    "--num-continuous-decode-steps 4 for nothing)",
                    fix=f"{tuning_key(dep, inst.role, 'extra_args')}: remove {flag}",
                )
