"""A model directory of real safetensors files with made-up weights, for the staging rehearsal
and the sim: `python -m pdctl.testing.dummy_model DIR [--mib 300] [--shards 4]`.

Each shard holds BF16 tensors of 4096 columns, its header written as safetensors writes it
(pdctl.model.weights.header_bytes); the data is seeded pseudo-random bytes, so rsync cannot
compress it and two runs make the same files. An index (model.safetensors.index.json) maps
every tensor to its shard, as a sharded Hugging Face checkpoint has.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pdctl.model.weights import INDEX_FILE, header_bytes

COLUMNS = 4096
ROW_BYTES = COLUMNS * 2  # BF16
ROWS_PER_TENSOR = 1024
CHUNK_BYTES = 8 << 20


def _shard_tensors(shard: int, rows: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensors of at most ROWS_PER_TENSOR rows, `rows` in all."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    n = 0
    while rows > 0:
        take = min(rows, ROWS_PER_TENSOR)
        out[f"model.layers.{shard}.mlp.w{n:03d}.weight"] = ("BF16", (take, COLUMNS))
        rows, n = rows - take, n + 1
    return out


def _write_shard(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], seed: int) -> None:
    head, data_bytes = header_bytes(tensors)
    rng = random.Random(seed)
    with path.open("wb") as f:
        f.write(head)
        while data_bytes > 0:
            chunk = min(data_bytes, CHUNK_BYTES)
            f.write(rng.randbytes(chunk))
            data_bytes -= chunk


def make(root: Path, mib: int = 300, shards: int = 4, seed: int = 0) -> list[Path]:
    """Write the model under root (created); the shards' paths."""
    root.mkdir(parents=True, exist_ok=True)
    rows = max(1, (mib << 20) // ROW_BYTES // shards)
    weight_map, paths = {}, []
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = _shard_tensors(shard, rows)
        _write_shard(root / name, tensors, seed * 1000 + shard)
        weight_map.update(dict.fromkeys(tensors, name))
        paths.append(root / name)
    index = {"metadata": {"total_size": shards * rows * ROW_BYTES}, "weight_map": weight_map}
    (root / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")
    (root / "config.json").write_text(json.dumps({"architectures": ["PdSimForCausalLM"]}) + "\n")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--mib", type=int, default=300, help="Weights in all (MiB).")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    make(a.directory, a.mib, a.shards, a.seed)


if __name__ == "__main__":
    main()
