"""pdctl/escape.py: hostile strings survive systemd's own parsers exactly.

Command lines are read back by systemd itself (`systemd --test` loads the unit and dumps each
ExecStart's argv); env files by systemd's EnvironmentFile= parser (`load_env_file` of
libsystemd-shared, the function the manager calls). Exact expected texts follow the rules of
systemd.syntax(7), systemd.service(5) "Command lines" and systemd.exec(5) "EnvironmentFile=".
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdctl import names, render
from pdctl.escape import env_file_value, systemd_command, systemd_word
from pdctl.render import command, render_instance
from pdctl.spec import Deployment
from tests.conftest import ROOT, require_path

GATEWAY_TEMPLATES = ROOT / "roles" / "pdstack_gateway" / "templates"

HOSTILE = [
    "plain",
    "with space",
    "  lead and trail  ",
    "tab\there",
    "new\nline",
    "cr\rx",
    'dq"x',
    "sq'x",
    "back\\slash",
    "trail\\",
    "\\n is not a newline",
    "50%",
    "%n%i%%",
    "$HOME",
    "${HOME}",
    "$$",
    "`id`",
    ";",
    "a;b",
    "#not a comment",
    "",
    "é ü 日本語 🚀",
    "\u00a0nbsp",
    "\u202eright-to-left",
    "\x7fdel\x01soh\x1besc",
    "--flag=v w",
    '{"a": [1, "b c"]}',
]

# Exact texts, per the man pages: `%` -> `%%` and `$` -> `$$` always; anything beyond
# [A-Za-z0-9_@%+=:,./-] is double-quoted with C escapes for `\`, `"` and non-printables.
EXPECTED_WORDS = {
    "plain": "plain",
    "--cpunodebind=0": "--cpunodebind=0",
    "/models/a.b,c:d@e+f": "/models/a.b,c:d@e+f",
    "with space": '"with space"',
    "new\nline": '"new\\nline"',
    "tab\there": '"tab\\there"',
    'dq"x': '"dq\\"x"',
    "sq'x": '"sq\'x"',
    "back\\slash": '"back\\\\slash"',
    "50%": "50%%",
    "%n": "%%n",
    "$HOME": '"$$HOME"',
    "${HOME}": '"$${HOME}"',
    ";": '";"',
    "#x": '"#x"',
    "": '""',
    "é": '"é"',
    "\x7f\x01": '"\\x7f\\x01"',
    "\u00a0\u202e": '"\\u00a0\\u202e"',
}
EXPECTED_ENV = {
    "plain": "plain",
    "": "",
    "0,1,2,3": "0,1,2,3",
    "a~b/c+d=e": "a~b/c+d=e",
    "with space": '"with space"',
    "50%": "50%",
    "$HOME": '"\\$HOME"',
    "`id`": '"\\`id\\`"',
    'dq"x': '"dq\\"x"',
    "back\\slash": '"back\\\\slash"',
    "sq'x": '"sq\'x"',
    "new\nline": '"new\nline"',
    "#x": '"#x"',
}


@pytest.mark.parametrize("word", EXPECTED_WORDS, ids=repr)
def test_systemd_word_exact(word: str) -> None:
    assert systemd_word(word) == EXPECTED_WORDS[word]


@pytest.mark.parametrize("value", EXPECTED_ENV, ids=repr)
def test_env_file_value_exact(value: str) -> None:
    assert env_file_value(value) == EXPECTED_ENV[value]


def test_nul_is_refused_not_truncated() -> None:
    with pytest.raises(ValueError, match="NUL"):
        systemd_word("a\0b")
    with pytest.raises(ValueError, match="NUL"):
        env_file_value("a\0b")


def test_no_rendered_word_spans_lines_or_splits() -> None:
    for word in HOSTILE:
        out = systemd_word(word)
        assert "\n" not in out and "\r" not in out
        assert out == out.strip() and (" " not in out or out.startswith('"'))


# ----- systemd's unit parser ---------------------------------------------------------------
def _systemd() -> Path:
    return require_path(
        next(
            (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if Path(p).exists()),
            None,
        ),
        "systemd (the manager binary, for `systemd --test`)",
    )


def _dump_word(text: str, i: int) -> tuple[str, int]:
    """One word of systemd's argv dump (quote_command_line): bare, or double-quoted with
    backslash escapes (C escapes for non-printables, `\\X` for X otherwise)."""
    if text[i] != '"':
        end = text.find(" ", i)
        end = len(text) if end < 0 else end
        return text[i:end], end
    out, i = [], i + 1
    simple = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
    while text[i] != '"':
        if text[i] != "\\":
            out.append(text[i])
            i += 1
            continue
        c = text[i + 1]
        if c in simple:
            out.append(simple[c])
            i += 2
        elif c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            out.append(chr(int(text[i + 2 : i + 2 + width], 16)))
            i += 2 + width
        elif c.isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(c)
            i += 2
    return "".join(out), i + 1


def _parse_dump(line: str) -> list[str]:
    words, i = [], 0
    while i < len(line):
        word, i = _dump_word(line, i)
        words.append(word)
        i += 1  # the separating space
    return words


@pytest.fixture
def unit_dir() -> Iterator[Path]:
    # systemd refuses --test as root; the unprivileged user must reach the units.
    path = Path(tempfile.mkdtemp(prefix="pdstack-units-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def systemd_argvs(unit_dir: Path, units: dict[str, str]) -> dict[str, list[str]]:
    """unit name -> the ExecStart argv systemd's own unit parser stores for it."""
    for name, text in units.items():
        (unit_dir / name).write_text(text)
        (unit_dir / name).chmod(0o644)
    target = unit_dir / "pdstack-escape-test.target"
    target.write_text("[Unit]\nDefaultDependencies=no\nWants=" + " ".join(units) + "\n")
    target.chmod(0o644)
    argv = [str(_systemd()), "--test", "--system", f"--unit={target.name}", "--log-target=console"]
    if os.geteuid() == 0:
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
    # The trailing ':' appends the built-in unit path (the engine unit's default dependencies).
    env = {"PATH": os.environ["PATH"], "HOME": str(unit_dir), "SYSTEMD_UNIT_PATH": f"{unit_dir}:"}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    warnings = [line for line in run.stderr.splitlines() if str(unit_dir) in line]
    assert not warnings, warnings  # e.g. "Ignoring unknown escape sequences"
    out = {}
    for name in units:
        section = run.stdout.split(f"-> Unit {name}:\n", 1)[1]
        match = re.search(r"^\t\t\tCommand Line: (.*)$", section, re.M)
        assert match, section[:2000]
        out[name] = _parse_dump(match.group(1))
    return out


def _stored(word: str) -> str:
    """systemd keeps `$$` in the parsed argv and turns it into `$` at exec time."""
    return word.replace("$", "$$")


def test_hostile_words_round_trip_through_systemd(unit_dir: Path) -> None:
    line = systemd_command(["/bin/echo", *HOSTILE])
    unit = f"[Unit]\nDefaultDependencies=no\n[Service]\nType=exec\nExecStart={line}\n"
    argv = systemd_argvs(unit_dir, {"hostile.service": unit})["hostile.service"]
    assert argv == ["/bin/echo", *map(_stored, HOSTILE)]


# Every string the spec lets through to a launch line, at its most awkward.
AWKWARD = {
    "model.path": "/models/My Model 50%/$HOME \"q\" 'q' \\ é",
    "model.served_name": "dsv4 ${USER} %n 日本",
}


@pytest.fixture
def awkward(load: Any, shipped: Any) -> Deployment:
    profile = shipped("reference")
    profile["model"]["path"] = AWKWARD["model.path"]
    profile["model"]["served_name"] = AWKWARD["model.served_name"]
    profile["engine"]["common"]["env"]["NCCL_DEBUG_SUBSYS"] = 'INIT,ENV $x "q" `id` \\ 50%'
    profile["engine"]["decode"]["extra_args"] = ["--json-model-override-args", '{"a":"b"}']
    return load(profile)  # type: ignore[no-any-return]


def test_rendered_engine_units_parse_back_to_the_command(
    unit_dir: Path, awkward: Deployment
) -> None:
    units = {inst.unit: render_instance(inst, awkward).unit for inst in awkward.instances}
    argvs = systemd_argvs(unit_dir, units)
    for inst in awkward.instances:
        expected = command(inst, awkward)
        assert AWKWARD["model.path"] in expected
        assert argvs[inst.unit] == [_stored(w) for w in expected], inst.unit


# ----- systemd's env-file parser -----------------------------------------------------------
def _load_env_file() -> Any:
    found = sorted(glob.glob("/usr/lib/*/systemd/libsystemd-shared-*.so")) + sorted(
        glob.glob("/usr/lib/systemd/libsystemd-shared-*.so")
    )
    lib = ctypes.CDLL(str(require_path(found[0] if found else None, "libsystemd-shared")))
    fn = lib.load_env_file
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
    ]
    fn.restype = ctypes.c_int
    return fn


def systemd_env(path: Path) -> dict[str, str]:
    """The assignments EnvironmentFile=path gives a service: systemd's load_env_file()."""
    out = ctypes.POINTER(ctypes.c_char_p)()
    assert _load_env_file()(None, str(path).encode(), ctypes.byref(out)) == 0
    pairs, i = {}, 0
    while out[i]:
        key, _, value = out[i].decode().partition("=")
        pairs[key] = value
        i += 1
    return pairs


def test_hostile_env_values_round_trip_through_systemd(tmp_path: Path) -> None:
    values = {f"K{i}": v for i, v in enumerate(HOSTILE)}
    path = tmp_path / "hostile.env"
    path.write_text("".join(f"{k}={env_file_value(v)}\n" for k, v in values.items()))
    assert systemd_env(path) == values


def test_rendered_env_files_parse_back_to_the_environment(
    tmp_path: Path, awkward: Deployment
) -> None:
    for inst in awkward.instances:
        rendered = render_instance(inst, awkward)
        path = tmp_path / f"{inst.name}.env"
        path.write_text(rendered.env_text)
        assert systemd_env(path) == rendered.environment
        assert "$x" in rendered.environment["NCCL_DEBUG_SUBSYS"]


# ----- the gateway templates (rendered by Ansible with the same filters) --------------------
def test_gateway_unit_parses_back_to_smg_args(unit_dir: Path, load: Any, shipped: Any) -> None:
    profile = shipped("reference")
    profile["router"]["extra_args"] = ["--log-dir", "/var/log/smg-50%", "--request-id-headers=x"]
    dep = load(profile)
    unit = (
        render.jinja_env(GATEWAY_TEMPLATES)
        .get_template("gateway.service.j2")
        .render(
            ansible_managed=render.MANAGED,
            command_lines=render.gateway_command_lines(dep, api_key=True),
            # Parsed by systemd too: the run below fails on a malformed ExecStartPost=.
            register_command=systemd_command(render.register_command("gpu-node-1")),
            api_key_set=True,
            env_file=names.GATEWAY_ENV_FILE,
            state_dir=names.STATE_DIR,
            state_name="pdstack-gateway",
            user=names.SERVICE_USER,
            config_group=names.SERVICE_USER,
            documentation=names.documentation(),
        )
    )
    argv = systemd_argvs(unit_dir, {"pdstack-gateway.service": unit})["pdstack-gateway.service"]
    # The API key stays a substitution systemd makes at exec time from the env file.
    expected = [names.GATEWAY_BIN, *render.router_args(dep)]
    assert argv == [*map(_stored, expected), "--api-key", "${PDSTACK_GATEWAY_API_KEY}"]
    assert "/var/log/smg-50%" in expected


def test_gateway_env_file_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pdctl.ops import gateway

    # The role's preflight allows letters, digits and . _ ~ + / = - in the key: all written
    # bare, so pdctl's own reader (ops/gateway.py) and systemd read the same key.
    key = "Ab0._~+/=-xyz"
    template = render.jinja_env(GATEWAY_TEMPLATES).get_template("gateway.env.j2")
    text = template.render(ansible_managed="m", api_key=key, key_var=names.GATEWAY_KEY_VAR)
    path = tmp_path / "gateway.env"
    path.write_text(text)
    assert systemd_env(path) == {"PDSTACK_GATEWAY_API_KEY": key}
    monkeypatch.delenv(gateway.KEY_VAR, raising=False)
    monkeypatch.setattr(gateway, "KEY_FILES", (path,))
    assert gateway.api_key() == key
