"""No function in pdctl/ or monitoring/ runs over 100 lines (issue 43: a maintainer changes
a decision in one place). A function's length is its `def` line through its last line, as
the AST gives them; a nested function counts inside its parent and on its own."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

PACKAGES = ("pdctl", "monitoring")
LIMIT = 100


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function and method in `source`."""
    return [
        (node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_function_lengths_counts_def_through_last_line() -> None:
    source = "def outer():\n    def inner():\n        return 1\n\n    return inner\n"
    assert sorted(function_lengths(source)) == [("inner", 2, 2), ("outer", 1, 5)]


def test_no_function_over_100_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line, length in function_lengths(path.read_text())
        if length > LIMIT
    ]
    assert not long, "split these into functions named for what they hold:\n" + "\n".join(long)
