"""The one exception type the CLI turns into `Error: …` and a non-zero exit."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


class PdctlError(Exception):
    """A problem the user can act on; the message says what and where."""

    exit_code = 2


class SpecError(PdctlError):
    """Bad deployment input, located by file and key path."""

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + message)


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
