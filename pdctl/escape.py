"""Quoting for the two formats pdstack writes from user input: systemd command lines and
systemd environment files. Each function returns text that the format's own parser (systemd's
unit-file parser, systemd's EnvironmentFile= parser) reads back as exactly the given string.

The spec refuses control characters at load time; these functions stay exact for any string
except NUL, which neither format can carry.
"""

from __future__ import annotations

import re

# Words made only of these are written bare; anything else is double-quoted.
_BARE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_BARE_ENV_VALUE = re.compile(r"[A-Za-z0-9_@%+=:,./~-]*")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
# systemd's env-file parser unescapes only these after a backslash inside double quotes.
_ENV_FILE_ESCAPED = re.compile(r'(["\\`$])')


def _no_nul(text: str, what: str) -> None:
    if "\0" in text:
        raise ValueError(f"a NUL character cannot be written into {what}")


def _c_escape(ch: str) -> str:
    if ch in _C_ESCAPES:
        return _C_ESCAPES[ch]
    if ch.isprintable():
        return ch
    code = ord(ch)
    # \xNN is a raw byte to systemd: only ASCII may use it, the rest are code points.
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def systemd_word(word: str) -> str:
    """One argument of an `Exec*=` command line (systemd.service "Command lines").

    systemd expands `%` specifiers on the whole line, then splits it into words honouring
    double quotes with C escapes, then at exec time substitutes `$VAR`/`${VAR}`: so `%` is
    written `%%`, `$` is written `$$`, and a word with anything beyond a plain set of
    characters is double-quoted with `\\`, `"` and non-printables C-escaped. Quoting also keeps
    a lone `;` (systemd's command separator) and a leading `#` literal.
    """
    _no_nul(word, "a systemd command line")
    word = word.replace("%", "%%").replace("$", "$$")
    if _BARE_WORD.fullmatch(word):
        return word
    return '"' + "".join(map(_c_escape, word)) + '"'


def systemd_command(words: list[str]) -> str:
    return " ".join(map(systemd_word, words))


def env_file_value(value: str) -> str:
    """The value of a `KEY=VALUE` line of an `EnvironmentFile=` (systemd.exec).

    systemd reads such files without variable or specifier expansion; unquoted values lose
    backslashes and trailing blanks, so anything beyond a plain set of characters is
    double-quoted with `"`, `\\`, `` ` `` and `$` backslash-escaped, the only escapes the
    parser undoes inside double quotes (a newline stays literal there).
    """
    _no_nul(value, "an environment file")
    if _BARE_ENV_VALUE.fullmatch(value):
        return value
    return '"' + _ENV_FILE_ESCAPED.sub(r"\\\1", value) + '"'


# The quoting filters the templates use: pdctl.render's Jinja environment and, through
# filter_plugins/pdstack.py, Ansible's.
FILTERS = {"pdstack_env_value": env_file_value}
