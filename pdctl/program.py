"""A click command run as a program: pdctl's errors become one line and an exit code."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from pdctl.errors import PdctlError


def run(command: click.Command, prog_name: str | None = None) -> NoReturn:
    """Run a click command as a program: a PdctlError becomes one `Error: …` line and its
    exit code, never a traceback."""
    try:
        command.main(prog_name=prog_name, standalone_mode=False)
    except PdctlError as e:
        click.secho(f"Error: {e}", fg="red", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(0)
