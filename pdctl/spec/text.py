"""What a string from a profile or an inventory may hold, by where it ends up.

Every such string reaches a systemd unit, an env file, a command line or a metric label.
Rendering quotes for each format (pdctl/escape.py); these rules refuse at load time what no
quoting makes right: a control character that would start a new unit directive, a host that
is really two arguments, an `extra_args` element that is several. Each returns None when the
value is fine, else a message saying what is allowed.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata

# Cc: C0/C1 controls (newline, CR, tab, NUL, ESC, DEL); Cf: invisible format characters such
# as bidi overrides; Cs: lone surrogates (not encodable); Zl/Zp: Unicode line breaks.
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "newline", "\r": "carriage return", "\t": "tab", "\0": "NUL", "\x1b": "escape"}

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DNS_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
_NUMBER = re.compile(r"-[0-9][0-9.eE+-]*")
# Shell syntax has no meaning in an argument list: one of these in an element means a shell
# command line was pasted where arguments belong.
SHELL_CHARS = ";&|<>`$\\'()"
ARG_RULE = (
    "each element is one flag (--name or --name=value) or one value, as argv holds it: "
    f"no whitespace and none of {' '.join(SHELL_CHARS)} (no shell runs these)"
)


def control_problem(text: str) -> str | None:
    for ch in text:
        if unicodedata.category(ch) in CONTROL_CATEGORIES:
            name = _NAMED.get(ch, unicodedata.name(ch, "control character"))
            return (
                f"control character U+{ord(ch):04X} ({name.lower()}) is not allowed: "
                "profile and inventory strings reach systemd units, env files and command "
                "lines, so each is one line of printable text"
            )
    return None


def env_key_problem(key: str) -> str | None:
    if ENV_KEY.fullmatch(key):
        return None
    return (
        f"{key!r} is not an environment variable name: letters, digits and _, "
        "not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)"
    )


def host_problem(host: str) -> str | None:
    """An IPv4 address or a DNS name (`_` allowed in labels, as /etc/hosts allows). IPv6 is
    refused: URLs and scrape targets are written as host:port, unbracketed."""
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    labels = host.split(".")
    if (
        len(host) <= 253
        and all(_DNS_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    ):
        return None
    return (
        f"{host!r} is not an IPv4 address or DNS name: dot-separated labels of letters, digits, "
        "- and _ (1-63 characters, not starting or ending with -); IPv6 is not supported"
    )


def value_problem(value: str) -> str | None:
    """A free-text argument value (model path, served name): quoted when rendered, so spaces
    are fine; it must not read as a flag."""
    if not value:
        return "must not be empty"
    if value.startswith("-"):
        return f"{value!r} starts with '-', which SGLang reads as a flag: any text but that"
    return None


def arg_problem(arg: str) -> str | None:
    """One `extra_args` element."""
    if not arg:
        return f"an empty element: {ARG_RULE}"
    bad = ["whitespace"] * any(c.isspace() for c in arg)
    bad += [repr(c) for c in SHELL_CHARS if c in arg]
    if bad:
        return f"{arg!r} holds {', '.join(bad)}: {ARG_RULE}"
    if arg.startswith("-") and not _NUMBER.fullmatch(arg):
        name, eq, value = arg.partition("=")
        if not _FLAG.fullmatch(name) or (eq and not value):
            return f"{arg!r} is not a flag: {ARG_RULE}"
    return None
