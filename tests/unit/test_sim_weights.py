"""The sim reads the model directory it is given: each safetensors file's header and size,
checked as safetensors checks it when SGLang opens it, failing with its words
(pdctl.model.weights; docs/sim.md)."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl.model import weights
from pdctl.testing import dummy_model
from pdctl.testing.stack import in_process

FAST = {"PDSIM_TIME_SCALE": "0.01", "PDSIM_STARTUP_DELAY_S": "0"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    dummy_model.make(root, mib=4, shards=2)
    return root


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "m"
    dest.mkdir()
    for p in model_dir.iterdir():
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


def test_the_generated_model_reads_back_header_by_header(model_dir: Path) -> None:
    found = weights.load(str(model_dir))
    assert found is not None and len(found.files) == 2
    index = json.loads((model_dir / weights.INDEX_FILE).read_text())["weight_map"]
    assert found.tensors == len(index)
    for h in found.files:
        assert h.size == h.path.stat().st_size
        (n,) = struct.unpack("<Q", h.path.read_bytes()[:8])
        assert h.size == 8 + n + h.data_bytes and n % 8 == 0
        assert all(t.dtype == "BF16" and t.shape[1] == dummy_model.COLUMNS for t in h.tensors)


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    if how == "truncated":
        del data[-1000:]
    elif how == "header cut":
        del data[8 + n // 2 :]
    elif how == "not json":
        data[8:16] = b"garbage!"
    elif how == "huge header":
        data[:8] = struct.pack("<Q", 200_000_000)
    elif how == "tiny":
        del data[4:]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "variant"),
    [
        ("truncated", "MetadataIncompleteBuffer"),
        ("header cut", "InvalidHeaderLength"),
        ("not json", "InvalidHeaderDeserialization"),
        ("huge header", "HeaderTooLarge"),
        ("tiny", "HeaderTooSmall"),
    ],
)
def test_a_corrupt_file_fails_with_safetensors_words(
    model_dir: Path, tmp_path: Path, how: str, variant: str
) -> None:
    dest = _copy(model_dir, tmp_path)
    _corrupt(dest / "model-00002-of-00002.safetensors", how)
    with pytest.raises(weights.WeightsError) as e:
        weights.load(str(dest))
    assert str(e.value) == (
        f"safetensors_rust.SafetensorError: Error while deserializing header: {variant}"
    )


def test_a_shard_the_index_names_must_be_there(model_dir: Path, tmp_path: Path) -> None:
    dest = _copy(model_dir, tmp_path)
    (dest / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(weights.WeightsError) as e:
        weights.load(str(dest))
    assert str(e.value) == (
        f"RuntimeError: model.safetensors.index.json references 1 shard file(s) missing from "
        f"{dest} (incomplete download?): ['model-00001-of-00002.safetensors']"
    )


def test_no_directory_or_no_safetensors_means_no_weights(tmp_path: Path) -> None:
    assert weights.load(str(tmp_path / "absent")) is None
    (tmp_path / "config.json").write_text("{}")
    assert weights.load(str(tmp_path)) is None


def test_the_sim_loads_a_generated_model_at_start_up(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def run() -> None:
        async with in_process("null", FAST, "--model-path", str(model_dir)) as server:
            assert server.status == "up"

    asyncio.run(run())
    out = capsys.readouterr()
    assert "Loading safetensors checkpoint shards: 100% Completed | 2/2" in out.out + out.err


def test_the_sim_dies_at_start_up_on_a_corrupt_model(model_dir: Path, tmp_path: Path) -> None:
    dest = _copy(model_dir, tmp_path)
    _corrupt(dest / "model-00001-of-00002.safetensors", "truncated")
    proc = subprocess.run(
        [sys.executable, "-m", "pdctl.sim", "--model-path", str(dest), "--port", "0"],
        env={**os.environ, **FAST},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    assert "Scheduler hit an exception" in log
    assert "SafetensorError: Error while deserializing header: MetadataIncompleteBuffer" in log
    assert "The server is fired up" not in log
