"""Every role-internal variable (`_pdstack_*`) a role, playbook or template reads is defined
somewhere in the roles: in a vars or defaults file, a task's `vars:`, a `set_fact`, a
`register:` or a `loop_var`. Ansible finds an undefined one only when the task runs: a merge
that dropped a vars block converged every single-host test and failed them all at the first
task of the missing block."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"(?<![\w.])(_pdstack_[a-z0-9_]+)")


def _defined_keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str):
                yield key
            if key == "register" and isinstance(value, str):
                yield value
            if key == "loop_control" and isinstance(value, dict) and "loop_var" in value:
                yield value["loop_var"]
            yield from _defined_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _defined_keys(item)


def _files() -> list[Path]:
    roles = [p for p in (ROOT / "roles").rglob("*") if p.is_file()]
    return [*roles, *(ROOT / "templates").rglob("*.j2"), ROOT / "site.yml", ROOT / "monitoring.yml"]


def test_every_role_variable_read_is_defined() -> None:
    defined: set[str] = set()
    read: dict[str, str] = {}
    for path in _files():
        text = path.read_text(errors="replace")
        if path.suffix == ".yml" and "roles" in path.parts:
            defined.update(_defined_keys(yaml.safe_load(text)))
        for m in READ.finditer(text):
            read.setdefault(m.group(1), str(path.relative_to(ROOT)))
    assert len(read) > 50, read  # the scan sees the roles' variables
    undefined = {name: where for name, where in read.items() if name not in defined}
    assert not undefined, f"read but defined nowhere (name: first file): {undefined}"
