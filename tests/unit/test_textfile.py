"""The bounded read of a user-named text file (a trace, a sweep result): the text, or one
error line that names the file and says why, with what the file is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.errors import PdctlError
from pdctl.textfile import read_text

LIMIT = 1 << 20


def _error(path: Path) -> str:
    with pytest.raises(PdctlError) as exc:
        read_text(path, LIMIT, "a trace")
    return str(exc.value)


def test_text_up_to_the_limit_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("é\n" + "x" * (LIMIT - 3))  # é is two bytes: exactly LIMIT
    assert read_text(path, LIMIT, "a trace") == "é\n" + "x" * (LIMIT - 3)


def test_one_byte_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * (LIMIT + 1))
    assert _error(path) == f"{path}: larger than 1 MiB: not a trace"


def test_binary_names_the_first_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"ok\n\xff\xfe")
    assert _error(path) == f"{path}: not UTF-8 text (byte 3): not a trace"


def test_unreadable_paths_say_why(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    assert _error(missing) == f"{missing}: No such file or directory"
    assert _error(tmp_path) == f"{tmp_path}: Is a directory"
