"""benchmarks/real_engine/bundle.py's trim of flashinfer/data (docs/real-engine.md): what
flashinfer JIT-compiles at the engines' first forward pass stays in the bundle. The lane's
third run died because the trim had dropped the norm module's sources."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "flashinfer"


@pytest.fixture(scope="module")
def bundle() -> ModuleType:
    """bundle.py (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location(
        "bundle", ROOT / "benchmarks" / "real_engine" / "bundle.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def data_files(site: Path) -> set[str]:
    data = site / "flashinfer" / "data"
    return {str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()}


# A flashinfer laid out as 0.6.15's: the module's two sources, the headers they include (one
# under #if 0, one quoted beside its includer, one found through csrc), CCCL, and what no
# source includes.
NORM_JIT = """def gen_norm_module():
    return gen_jit_spec("norm", [
        jit_env.FLASHINFER_CSRC_DIR / "norm.cu",
        jit_env.FLASHINFER_CSRC_DIR / "flashinfer_norm_binding.cu",
    ])
"""
INCLUDED = {
    "csrc/norm.cu": '#include <flashinfer/norm.cuh>\n#include "tvm_ffi_utils.h"\n',
    "csrc/flashinfer_norm_binding.cu": '#include "tvm_ffi_utils.h"\n',
    "csrc/tvm_ffi_utils.h": "#include <tvm/ffi/function.h>\n#include <cuda_runtime.h>\n",
    "include/flashinfer/norm.cuh": (
        '#include "utils.cuh"\n#if 0\n  #  include "trtllm/common/cudaUtils.h"\n#endif\n'
    ),
    "include/flashinfer/utils.cuh": "#include <cub/cub.cuh>\n",
    "include/flashinfer/trtllm/common/cudaUtils.h": "#include <cublasLt.h>\n",
    "cccl/cub/cub/cub.cuh": "#include <cuda/std/type_traits>\n",
    "cccl/libcudacxx/include/cuda/std/type_traits": "",
}
UNREAD_CCCL = {
    "cccl/libcudacxx/include/cuda/atomic": "",  # what cooperative_groups.h includes
    "cccl/thrust/thrust/sort.h": "",
}
NOT_INCLUDED = {
    "csrc/batch_decode.cu": "#include <flashinfer/attention/decode.cuh>\n",
    "include/flashinfer/attention/decode.cuh": "",
    "include/utils.cuh": "",  # a quoted name is looked up beside its includer first
    "cutlass/include/cutlass/cutlass.h": "",
    "spdlog/include/spdlog/spdlog.h": "",
    "cccl/docs/index.md": "",
    "cccl/libcudacxx/test/atomic.pass.cpp": "",
    "build_backend.py": "",
}


@pytest.fixture
def flashinfer_site(tmp_path: Path) -> Path:
    write(tmp_path / "flashinfer" / "jit", {"norm.py": NORM_JIT})
    write(tmp_path / "flashinfer" / "data", {**INCLUDED, **UNREAD_CCCL, **NOT_INCLUDED})
    return tmp_path


def test_keeps_what_the_norm_module_includes_and_the_cccl_directories(
    bundle: ModuleType, flashinfer_site: Path
) -> None:
    bundle.trim_flashinfer(flashinfer_site)
    assert data_files(flashinfer_site) == set(INCLUDED) | set(UNREAD_CCCL)
    data = flashinfer_site / "flashinfer" / "data"
    assert not (data / "cutlass").exists() and not (data / "include/flashinfer/attention").exists()


def test_a_module_naming_no_source_stops_the_build(
    bundle: ModuleType, flashinfer_site: Path
) -> None:
    jit = flashinfer_site / "flashinfer" / "jit"
    write(jit, {"norm.py": "def gen_norm_module():\n    return None\n"})
    with pytest.raises(SystemExit, match=r"norm\.py's sources"):
        bundle.trim_flashinfer(flashinfer_site)


def locked_flashinfer(bundle: ModuleType) -> str:
    (req,) = [r for r in bundle.locked() if r.startswith("flashinfer-python==")]
    return str(req)


def test_the_locked_flashinfer_keeps_every_file_its_norm_build_reads(
    bundle: ModuleType, tmp_path: Path
) -> None:
    """The real wheel (where `make gpu-bundle` has cached it) through DROP and the trim,
    against what nvcc read building its norm module (the fixture's header says how)."""
    req = locked_flashinfer(bundle)
    fixture = FIXTURES / f"norm-{req.split('==')[1]}.txt"
    assert fixture.is_file(), f"{req} is locked; {fixture.name} lists what its norm build reads"
    wheels = bundle.cached(bundle.CACHE, req)
    if not wheels:
        pytest.skip(f"no {req} wheel in {bundle.CACHE} (make gpu-bundle caches it)")
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp_path, [n for n in z.namelist() if n.startswith("flashinfer/")])
    bundle.drop(tmp_path)
    bundle.trim_flashinfer(tmp_path)
    read = {line for line in fixture.read_text().splitlines() if not line.startswith("#")}
    kept = data_files(tmp_path)
    assert "csrc/norm.cu" in read
    assert read - kept == set()
    assert len(kept) < len(read) * 2  # a trim, not the 76 MB of JIT sources
