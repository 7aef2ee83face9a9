"""The unit templates share one sandbox, templates/hardening.j2: each calls it, none
spells its lines again, and each role's templates/ links to the one file (Ansible searches a
template's own folder; pdctl.render.jinja_env searches templates/ too)."""

from __future__ import annotations

import re

from pdctl import render
from tests.conftest import ROOT

SHARED = render.templates_dir() / "hardening.j2"
UNIT_TEMPLATES = sorted(
    [*ROOT.glob("roles/*/templates/*.service.j2"), *render.templates_dir().glob("*.service.j2")]
)


def _shared_lines() -> set[str]:
    body = SHARED.read_text().split("{% macro", 1)[1]
    return {line for line in body.splitlines() if re.fullmatch(r"[A-Z]\w+=[\w/]+", line)}


# The root units that run pdctl's restarts (recover@, finish) call it through this one.
OPS_SANDBOX = ROOT / "roles" / "pdstack_engine" / "templates" / "ops_sandbox.j2"
CALLS = {"hardening": "hardening.j2", "ops_sandbox": "ops_sandbox.j2"}


def test_every_unit_template_calls_the_shared_hardening() -> None:
    assert len(UNIT_TEMPLATES) == 9  # with the store's member and snapshot units
    shared = _shared_lines()
    assert {"NoNewPrivileges=yes", "ProtectSystem=strict", "RestrictRealtime=yes"} <= shared
    for path in [*UNIT_TEMPLATES, OPS_SANDBOX]:
        text = path.read_text()
        # its first line (ops_sandbox.j2's comment shows how it is called)
        first = text.split("-#}\n", 1)[-1].splitlines()[0]
        (macro,) = [m for m, f in CALLS.items() if first == f'{{% from "{f}" import {m} %}}']
        assert text.count(f"{{% call {macro}(") == 1, path
        again = shared & set(text.splitlines())
        assert not again, f"{path.name} repeats {sorted(again)}"
    assert OPS_SANDBOX.read_text().count("{% call hardening(") == 1


def test_each_role_with_units_links_to_the_one_file() -> None:
    roles = {p.parent.parent for p in UNIT_TEMPLATES if "roles" in p.parts}
    assert roles
    for role in roles:
        link = role / "templates" / "hardening.j2"
        assert link.is_symlink() and link.resolve() == SHARED.resolve(), link
