"""The one exception type the CLI turns into `Error: …` and a non-zero exit."""

from __future__ import annotations

from pdctl import exits


class PdctlError(Exception):
    """A problem the user can act on; the message says what and where."""

    exit_code = exits.BAD_INPUT


class SpecError(PdctlError):
    """Bad deployment input, located by file and key path."""

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + message)
