"""Runtime code never pulls in the rehearsal harness or the simulator: GPU hosts install pdctl to
run ops and the exporter, and those must not depend on test tooling."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUNTIME = [
    "pdctl.ops",
    "pdctl.ops.restart",
    "pdctl.ops.status",
    "pdctl.ops.recover",
    "pdctl.ops.doctor",
    "pdctl.ops.lock",
    "pdctl.coord.store",
    "pdctl.coord.lock",
    "pdctl.exporter.collector",
    "pdctl.pdclient",
    "pdctl.names",
    "pdctl.cli",
    # pdctl.cli loads its commands lazily: check each command module itself.
    "pdctl.cli.spec_commands",
    "pdctl.cli.ops_commands",
    "pdctl.cli.bench_commands",
    "pdctl.cli.analyze_commands",
    "pdctl.cli.capacity_commands",
    "pdctl.cli.lock_commands",
    "pdctl.exporter.command",
]


@pytest.mark.parametrize("module", RUNTIME)
def test_runtime_module_imports_no_harness_or_sim(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('pdctl.testing', 'pdctl.sim')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


OPS = [m for m in RUNTIME if m.startswith(("pdctl.ops", "pdctl.coord"))]


@pytest.mark.parametrize("module", OPS)
def test_the_ops_layer_imports_no_cli_toolkit(module: str) -> None:
    """ops takes plain values and raises pdctl's errors: prompts, colours and echo are cli's."""
    code = f"import sys, {module}\nprint('click' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports click"
