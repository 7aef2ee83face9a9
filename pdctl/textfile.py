"""Reading a user-named text file whole, bounded: a wrong path (a model's weights, an image)
gets a one-line error saying what the file is not, instead of filling memory or a traceback."""

from __future__ import annotations

from pathlib import Path

from pdctl.errors import PdctlError


def read_text(path: Path, max_bytes: int, what: str) -> str:
    """The file's UTF-8 text; a PdctlError if it cannot be read, is over `max_bytes` (a whole
    number of MiB) or is not UTF-8. `what` names the expected content: "not {what}"."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)  # one byte over tells a file at the limit from a larger one
    except OSError as e:
        raise PdctlError(f"{path}: {e.strerror}") from None
    if len(raw) > max_bytes:
        raise PdctlError(f"{path}: larger than {max_bytes >> 20} MiB: not {what}")
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise PdctlError(f"{path}: not UTF-8 text (byte {e.start}): not {what}") from None
