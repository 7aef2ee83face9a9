"""`make lint` reaches every script: each shell script of the repository is in the Makefile's
SHELL_SCRIPTS (shellcheck), each Python file outside tests/ under mypy's `files`."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from tests.conftest import ROOT


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()]


def _is_shell(path: Path) -> bool:
    if path.suffix == ".sh":
        return True
    with path.open("rb") as f:
        first = f.readline()
    return bool(re.match(rb"#!.*\b(ba)?sh\b", first))


def test_every_shell_script_is_shellchecked() -> None:
    make = (ROOT / "Makefile").read_text()
    (line,) = re.findall(r"^SHELL_SCRIPTS := (.+)$", make, re.M)
    checked = {p for pattern in line.split() for p in ROOT.glob(pattern)}
    assert "shellcheck -x $(SHELL_SCRIPTS)" in make
    scripts = {p for p in _tracked() if _is_shell(p)}
    assert scripts, "no shell scripts found"
    missing = sorted(str(p.relative_to(ROOT)) for p in scripts - checked)
    assert missing == [], f"not in the Makefile's SHELL_SCRIPTS: {missing}"


def test_every_python_file_outside_tests_is_type_checked() -> None:
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    roots = [ROOT / f for f in files]
    python = [p for p in _tracked() if p.suffix == ".py" and p.parts[len(ROOT.parts)] != "tests"]
    assert python
    missing = sorted(
        str(p.relative_to(ROOT)) for p in python if not any(p.is_relative_to(r) for r in roots)
    )
    assert missing == [], f"not under [tool.mypy] files: {missing}"
