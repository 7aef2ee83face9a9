"""Runtime code never pulls in the rehearsal harness or the simulator: GPU hosts install pdctl to
run ops and the exporter, and those must not depend on test tooling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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
    "pdctl.cli.recover_command",
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


# Every ops module (a new one is held to it without editing a list) and the coordination core.
OPS = [
    "pdctl.ops",
    *sorted(f"pdctl.ops.{p.stem}" for p in (ROOT / "pdctl/ops").glob("[!_]*.py")),
    *(m for m in RUNTIME if m.startswith("pdctl.coord")),
]


@pytest.mark.parametrize("module", OPS)
def test_the_ops_layer_imports_no_cli_toolkit(module: str) -> None:
    """ops takes plain values, raises pdctl's errors and returns typed results: prompts, echo
    and every rendering (rich's tables and colours) are cli's."""
    code = f"import sys, {module}\nprint(sorted({{'click', 'rich'}} & set(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"
