"""Shared test helpers: locating the real parts the tests run against."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PDSTACK_CACHE", "/var/cache/pdstack"))


def require_path(path: Path | str | None, what: str) -> Path:
    """A missing real part skips a local run but fails CI, where scripts/setup.sh provides it."""
    if path and Path(path).exists():
        return Path(path)
    message = f"{what} not found ({path}); run scripts/setup.sh"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str) -> Path:
    found = shutil.which(name) or str(ROOT / ".venv" / "bin" / name)
    return require_path(found, name)
