"""Checksum manifests: `pdctl model manifest` on the source, `pdctl model verify` on each copy
(one line per file that differs), and the disk check before a copy (pdctl.model.manifest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdctl.model import manifest
from tests.conftest import run_pdctl


@pytest.fixture
def revision(tmp_path: Path) -> Path:
    root = tmp_path / "rev"
    (root / "sub").mkdir(parents=True)
    (root / "a.safetensors").write_bytes(bytes(range(256)) * 40)
    (root / "sub" / "tokenizer.json").write_text('{"v": 1}')
    manifest.write(root)
    return root


def test_the_manifest_lists_every_file_with_its_size_and_sha256(revision: Path) -> None:
    doc = json.loads((revision / manifest.MANIFEST).read_text())
    assert sorted(doc["files"]) == ["a.safetensors", "sub/tokenizer.json"]
    assert doc["files"]["a.safetensors"]["size"] == 10240
    assert doc["total_bytes"] == 10240 + len('{"v": 1}')
    assert doc["files"]["sub/tokenizer.json"]["sha256"] == manifest.sha256_of(
        revision / "sub" / "tokenizer.json"
    )
    assert manifest.verify(revision) == []


def test_verify_names_each_file_that_differs_once(revision: Path) -> None:
    (revision / "sub" / "tokenizer.json").unlink()
    (revision / "extra.bin").write_bytes(b"x")
    data = bytearray((revision / "a.safetensors").read_bytes())
    data[5000] ^= 0xFF  # same size, other bytes: only the sha256 finds it
    (revision / "a.safetensors").write_bytes(bytes(data))
    found = manifest.verify(revision)
    assert len(found) == 3
    assert "sub/tokenizer.json: missing" in found
    assert "extra.bin: not in the manifest" in found
    assert any(line.startswith("a.safetensors: sha256 ") for line in found)


def test_verify_reports_a_wrong_size_without_hashing_it(revision: Path) -> None:
    with (revision / "a.safetensors").open("r+b") as f:
        f.truncate(100)
    assert manifest.verify(revision) == ["a.safetensors: 100 bytes, the manifest says 10240"]


def test_the_mark_follows_the_last_verify_and_the_manifest(revision: Path) -> None:
    assert not manifest.is_verified(revision)
    assert manifest.verify(revision, mark=True) == []
    assert manifest.is_verified(revision)
    (revision / "new.bin").write_bytes(b"y")
    manifest.write(revision)  # a re-made manifest voids the old mark
    assert not manifest.is_verified(revision)
    manifest.verify(revision, mark=True)
    assert manifest.is_verified(revision)
    (revision / "new.bin").write_bytes(b"z")
    assert manifest.verify(revision, mark=True) != []
    assert not (revision / manifest.VERIFIED).exists()


def test_space_counts_what_a_resumed_copy_still_needs(revision: Path, tmp_path: Path) -> None:
    dest = tmp_path / "root" / "m" / "r1"
    source_manifest = revision / manifest.MANIFEST
    fresh = manifest.space(dest, 0, source_manifest)  # dest not made yet
    assert fresh.missing_bytes == manifest.read(revision).total_bytes
    assert fresh.enough
    dest.mkdir(parents=True)
    (dest / "a.safetensors").write_bytes(b"\0" * 4000)  # cut off mid-copy
    assert manifest.space(dest, 0, source_manifest).missing_bytes == fresh.missing_bytes - 4000
    assert not manifest.space(dest, fresh.free_bytes, source_manifest).enough


def test_verify_command_prints_a_line_per_problem_and_fails(revision: Path) -> None:
    (revision / "sub" / "tokenizer.json").write_text("changed!")
    result = run_pdctl("model", "verify", str(revision))
    assert result.exit_code == 2
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{revision}/sub/tokenizer.json: sha256 ")
    assert result.stderr == f"Error: {revision}: 1 files differ from the manifest\n"


def test_verify_command_passes_a_matching_copy(revision: Path) -> None:
    result = run_pdctl("model", "verify", "--mark", str(revision))
    assert result.exit_code == 0 and "every file matches" in result.stdout
    assert manifest.is_verified(revision)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["model", "verify", "{missing}"], "no such directory"),
        (["model", "verify", "{bare}"], "no .pdstack-manifest.json"),
        (["model", "space", "{sized}", "--margin-gib", "100000000"], "not enough disk"),
        (["model", "manifest", "{missing}"], "no such directory"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, argv: list[str], words: str) -> None:
    (tmp_path / "bare").mkdir()
    (tmp_path / "sized").mkdir()
    (tmp_path / "sized" / manifest.MANIFEST).write_text('{"files": {}}')
    made = sorted(p.name for p in tmp_path.rglob("*"))
    paths = {p.name: p for p in tmp_path.iterdir()}
    result = run_pdctl(*(a.format(**paths, missing=tmp_path / "missing") for a in argv))
    assert result.exit_code == 2
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == made  # nothing changed
