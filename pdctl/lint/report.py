"""`pdctl validate`'s verdict and text: the command prints it, and site.yml's preflight reads it
in Ansible's own Python (filter_plugins/pdstack.py's `pdstack_validate`), so both say the same."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pdctl import exits
from pdctl.errors import PdctlError
from pdctl.lint import Finding, Severity, lint
from pdctl.spec import Deployment, load_deployment


def exit_code(findings: list[Finding], strict: bool) -> int:
    """Errors fail; warnings fail only when `strict`."""
    if any(f.severity is Severity.ERROR for f in findings):
        return exits.BAD_INPUT
    return exits.FAILED if strict and findings else exits.OK


def summary(dep: Deployment, findings: list[Finding], strict: bool) -> dict[str, int]:
    errors = sum(f.severity is Severity.ERROR for f in findings)
    return {
        "errors": errors,
        "warnings": len(findings) - errors,
        "instances": len(dep.instances),
        "hosts": len(dep.hosts),
        "exit_code": exit_code(findings, strict),
    }


def print_findings(
    dep: Deployment, findings: list[Finding], counts: dict[str, int], console: Console
) -> None:
    """The findings table and the counts line (`counts`: `summary`'s)."""
    scope = f"instances: {counts['instances']}, hosts: {counts['hosts']}, {dep.profile_path}"
    if not findings:
        _line(console, f"OK: no findings ({scope})", style="green")
        return
    table = Table("id", "severity", "where", "message", "fix", show_lines=True)
    for f in findings:
        style = "red" if f.severity is Severity.ERROR else "yellow"
        # Findings name inventory groups ([etcd], [router]): text, not rich markup.
        text = (escape(f.where), escape(f.message), escape(f.fix))
        table.add_row(f.id, f"[{style}]{f.severity}[/]", *text)
    console.print(table)
    _line(console, f"errors: {counts['errors']}, warnings: {counts['warnings']} ({scope})")


def _line(console: Console, text: str, style: str | None = None) -> None:
    """A plain line (paths and group names are not rich markup), never wrapped."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def validation_report(inventory: Path, profile: Path, strict: bool) -> tuple[int, str]:
    """`pdctl validate -i INVENTORY -p PROFILE [--strict]`: its exit code and its text, for a
    caller in the same Python (site.yml's preflight, through the `pdstack_validate` filter)."""
    out = StringIO()
    console = Console(file=out, width=120, color_system=None)
    try:
        dep = load_deployment(inventory, profile)
    except PdctlError as e:
        return e.exit_code, f"Error: {e}"
    findings = lint(dep)
    counts = summary(dep, findings, strict)
    print_findings(dep, findings, counts, console)
    return counts["exit_code"], out.getvalue()
