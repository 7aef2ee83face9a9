"""The safetensors format's header: 8 bytes little-endian length N, then N bytes of JSON naming
each tensor's dtype, shape and [begin, end) byte offsets into the data that follows.

`read_header` checks a file as the safetensors library's `SafeTensors::read_metadata`
(safetensors/src/tensor.rs) does when SGLang opens it (`safetensors.safe_open` in
srt/model_loader/weight_utils.py, `safetensors_weights_iterator`), and fails with the same
words: "Error while deserializing header: <variant>". Only the header is read, not the data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

# safetensors' MAX_HEADER_SIZE.
MAX_HEADER_BYTES = 100_000_000
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


class SafetensorError(Exception):
    """safetensors' own exception name (safetensors_rust.SafetensorError)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    path: Path
    size: int  # the file's bytes
    tensors: tuple[Tensor, ...]

    @property
    def data_bytes(self) -> int:
        return sum(t.end - t.begin for t in self.tensors)


def _bad(variant: str) -> SafetensorError:
    return SafetensorError(f"Error while deserializing header: {variant}")


def _tensors(raw: bytes) -> list[Tensor]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _bad("InvalidHeader") from None
    except ValueError:
        raise _bad("InvalidHeaderDeserialization") from None
    if not isinstance(doc, dict):
        raise _bad("InvalidHeaderDeserialization")
    out = []
    for name, info in doc.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            out.append(Tensor(name, info["dtype"], tuple(info["shape"]), int(begin), int(end)))
        except (KeyError, TypeError, ValueError):
            raise _bad("InvalidHeaderDeserialization") from None
    return sorted(out, key=lambda t: (t.begin, t.end))


def _validate(tensors: list[Tensor]) -> int:
    """The data's end, checked as safetensors' `Metadata::validate`: contiguous offsets from
    0, each the size its dtype and shape make."""
    end = 0
    for t in tensors:
        if t.begin != end or t.end < t.begin:
            raise _bad(f'InvalidOffset("{t.name}")')
        if t.dtype not in DTYPE_BYTES:
            raise _bad("InvalidHeaderDeserialization")
        if math.prod(t.shape) * DTYPE_BYTES[t.dtype] != t.end - t.begin:
            raise _bad("TensorInvalidInfo")
        end = t.end
    return end


def read_header(path: Path) -> Header:
    """The file's header, checked against its size; SafetensorError as safetensors words it,
    OSError when the file cannot be read."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        if size < 8:
            raise _bad("HeaderTooSmall")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise _bad("HeaderTooLarge")
        if n + 8 > size:
            raise _bad("InvalidHeaderLength")
        tensors = _tensors(f.read(n))
    if _validate(tensors) + 8 + n != size:
        raise _bad("MetadataIncompleteBuffer")
    return Header(path, size, tuple(tensors))


def header_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """The 8-byte length and JSON header for tensors {name: (dtype, shape)} laid out in name
    order, padded with spaces to 8 bytes as safetensors writes it; and the data's size."""
    doc, offset = {}, 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


# SGLang's SAFE_WEIGHTS_INDEX_NAME (load_format auto).
INDEX_FILE = "model.safetensors.index.json"


class WeightsError(Exception):
    """What SGLang raises at weight loading, as `ExceptionType: message`."""


@dataclass(frozen=True)
class Weights:
    files: tuple[Header, ...]

    @property
    def tensors(self) -> int:
        return sum(len(h.tensors) for h in self.files)

    @property
    def bytes(self) -> int:
        return sum(h.size for h in self.files)


def _indexed(files: list[Path], folder: Path) -> list[Path]:
    """SGLang's filter_duplicate_safetensors_files (srt/model_loader/weight_utils.py): with an
    index, every shard it names must exist, and only those are loaded."""
    index = folder / INDEX_FILE
    if not index.is_file():
        return files
    weight_map = json.loads(index.read_text())["weight_map"]
    named = {folder / f for f in weight_map.values()}
    missing = sorted(p.name for p in named if not p.is_file())
    if missing:
        raise WeightsError(
            f"RuntimeError: {INDEX_FILE} references {len(missing)} shard file(s) missing "
            f"from {folder} (incomplete download?): {missing}"
        )
    return [f for f in files if f in named]


def load(model_path: str) -> Weights | None:
    """The headers of the safetensors files SGLang's DefaultModelLoader._prepare_weights
    (srt/model_loader/loader.py) picks from model_path, each checked as safe_open checks it.
    None where SGLang would download from the hub (model_path is no directory) or would find no
    weights (a directory with no *.safetensors): the sim runs without weights there."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    headers = []
    for path in _indexed(files, folder):
        try:
            headers.append(read_header(path))
        except SafetensorError as e:
            raise WeightsError(f"safetensors_rust.SafetensorError: {e}") from None
        except OSError as e:
            raise WeightsError(f"{type(e).__name__}: {e}") from None
    return Weights(tuple(headers))
