"""Read a rendered launch line back as argparse would: flag -> its values, last one wins."""

from __future__ import annotations


def flag_values(args: list[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    flag: str | None = None
    for token in args:
        if token.startswith("--"):
            flag, _, inline = token.partition("=")
            out[flag] = (inline,) if inline else ()
        elif flag is not None:
            out[flag] += (token,)
    return out
