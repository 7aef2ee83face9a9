"""`pdctl` loads a command's module only when that command runs, and `--help` still lists them
all (speed itself is measured by benchmarks/cli_startup.py, not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from pdctl import exits
from pdctl.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[2]
# What `validate` must not pay for: the ops, bench, analyze and exporter stacks.
HEAVY = ("matplotlib", "aiohttp", "prometheus_client", "numpy", "pdctl.ops", "pdctl.bench")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_lazy_command_loads_under_its_name(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert isinstance(command, click.Command) and command.name == name


def test_help_lists_every_command(pdctl: Callable[..., Any]) -> None:
    run = pdctl("--help")
    assert run.exit_code == 0
    listed = run.stdout.split("Commands:", 1)[1].split()
    assert set(COMMANDS) <= set(listed)


def test_validate_imports_only_what_it_needs() -> None:
    code = (
        "import sys\n"
        "from pdctl.cli import cli\n"
        "args = ['validate', '-i', sys.argv[1], '-p', sys.argv[2]]\n"
        "try:\n"
        "    cli.main(args, standalone_mode=False)\n"
        "finally:\n"
        f"    heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}\n"
        f"                   or m.startswith({HEAVY!r}))\n"
        "    print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    inventory, profile = ROOT / "inventory.ini", ROOT / "deploy/profiles/reference.yml"
    out = subprocess.run(
        [sys.executable, "-c", code, str(inventory), str(profile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "OK: no findings" in out.stdout, out.stderr
    assert out.stderr.strip().endswith("HEAVY="), out.stderr


def test_help_lists_commands_in_the_registrys_order_with_the_exit_codes(
    pdctl: Callable[..., Any],
) -> None:
    """pip's registry: deliberate order, one-line summaries; then the one exit-code list,
    which docs/operations.md's table repeats."""
    out = pdctl("--help").stdout
    listed = [line.split()[0] for line in out.split("Commands:", 1)[1].split("Exit codes:")[0]
              .strip().splitlines()]  # fmt: skip
    assert listed == list(COMMANDS)
    assert out.index("pdctl status") < out.index("pdctl restart") < out.index("pdctl validate")
    codes = [int(line.split()[0]) for line in out.split("Exit codes:", 1)[1].strip().splitlines()]
    assert codes == list(exits.MEANINGS)
    docs = (ROOT / "docs" / "operations.md").read_text().split("### Exit codes", 1)[1]
    docs = docs.split("\n#", 1)[0]
    table = [int(c) for c in re.findall(r"^\| (\d+) \| ", docs, re.M)]
    assert table == list(exits.MEANINGS)


# What `pdctl recover` must not pay for: systemd starts it after every engine crash, and its
# start-up counts towards the time to serving again (benchmarks/recovery_phases.py). The
# profile models (pdctl.spec), the other ops commands' rendering (rich) and checks (lint),
# the Prometheus parser.
NOT_FOR_RECOVER = ("pdctl.spec", "pdctl.lint", "pdctl.ops.status", "rich", "prometheus_client")


def test_recover_imports_only_its_code_path() -> None:
    code = (
        "import sys\n"
        "from pdctl.cli import cli\n"
        "cli.get_command(None, 'recover')\n"
        f"print(','.join(sorted(m for m in sys.modules if m.startswith({NOT_FOR_RECOVER!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
