"""Build the GPU lane's bundle (`make gpu-bundle`): the packages of bundle.lock, unpacked,
trimmed to what a PD pair of SGLang 0.5.17 on one Hopper GPU loads, in one tar.xz that fits
the 64 MiB a call to the lent GPU machine carries (docs/real-engine.md).

    python3 benchmarks/real_engine/bundle.py [--out build/gpu-bundle] [--cache DIR]

Downloads with pip (hashes checked, no dependency resolution: the lock names everything),
so it runs on any Linux machine with PyPI access and binutils (`strip`, `readelf`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE / "bundle.lock"
CACHE = Path.home() / ".cache/pdstack/gpu-wheels"
PLATFORMS = (
    "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "any",
)  # fmt: skip
LIMIT_MIB = 60  # 64 MiB a call, less the repository itself (3.7 MiB) and a little room

# Paths (relative to site-packages, glob) left out, each with why.
DROP = {
    # Diffusion serving, its tests, and the Rust extensions of the rust HTTP server, gRPC
    # mode and multimodal preprocessing: none is on launch_server's HTTP path.
    "sglang/multimodal_gen": "diffusion models",
    "sglang/test": "SGLang's test helpers",
    "sglang/srt/*/_core.*.so": "rust server, gRPC and multimodal extensions",
    # 1.1 GB of FlashAttention kernels and the Blackwell/InfLLM builds: the lane runs the
    # triton attention backend on sm90 (sgl_kernel picks sm90/common_ops by capability).
    "sgl_kernel/flash_ops.abi3.so": "flash attention kernels (triton backend instead)",
    "sgl_kernel/flashmla_ops.abi3.so": "FlashMLA (MLA models only)",
    "sgl_kernel/infllm_ops.*.so": "InfLLM sparse attention",
    "sgl_kernel/sm100": "Blackwell build",
    # jedi's typeshed stubs are read when IPython completes code; sglang.utils imports
    # IPython.display, which imports jedi.
    "jedi/third_party": "type stubs",
    # The sources of libbacktrace, which apache-tvm-ffi's CMake build compiles into
    # libtvm_ffi.so; nothing reads them at run time (its JIT includes tvm_ffi/include and
    # 3rdparty/dlpack, kept).
    "tvm_ffi/3rdparty/libbacktrace": "sources built into libtvm_ffi.so",
    # smg's software bill of materials (1 MB of JSON): read by scanners, not by smg.
    "smg-*.dist-info/sboms": "SBOM",
    # xgrammar's static library is for building against it; the bindings are what imports.
    "xgrammar/lib/libxgrammar.a": "static library",
    # NIXL's expert-parallel package, headers and tools; its plugins other than UCX and
    # POSIX (object stores, GDS, libfabric, DOCA): keep_needed() keeps only the libraries
    # the two kept plugins and the bindings load.
    "nixl_ep": "expert-parallel kernels",
    "nixl_ep_cu13": "expert-parallel kernels",
    "nixl_cu13-*.data": "headers",
    "nixl_cu13.scripts": "command-line tools",
    "nixl_cu13.libs/nixl/libplugin_[!UP]*.so": "unused NIXL plugins",
    "nixl_cu13.libs/nixl/libplugin_PO[!S]*.so": "unused NIXL plugins",
    "nixl_cu13.libs/nixl/libtelemetry_*.so": "telemetry exporters",
    "nixl_cu13.libs/nixl/libtrace_*.so": "trace backends",
    # UCX opens its transports by name and skips one that is absent; the lane's pair shares
    # one GPU (cuda_ipc, shared memory, tcp), so no InfiniBand transport and none of the
    # verbs, mlx5 and netlink libraries only they load.
    "nixl_cu13.libs/ucx/libuct_ib*.so*": "UCX InfiniBand transports",
    "nixl_cu13.libs/ucx/libucx_perftest*.so*": "UCX perftest modules",
}
# flashinfer JIT-compiles a kernel at its first call from CUDA sources under flashinfer/data
# (flashinfer/jit/env.py). The lane's engines compile one module there: sgl_kernel's rmsnorm and
# fused_add_rmsnorm call flashinfer.norm (gen_norm_module, flashinfer/jit/norm.py; SGLang 0.5.17's
# RMSNorm.forward_cuda calls them). Attention is Triton's, sampling PyTorch's, and SiLU and RoPE
# are SGLang's own JIT kernels (sglang/kernels, kept whole), so no other flashinfer module builds.
FLASHINFER_DATA = "flashinfer/data"
FLASHINFER_JIT_MODULES = ("norm",)
# The vendored CCCL include directories, whole: they come first on nvcc's path (-I, before the
# CUDA toolkit's), and the toolkit's own headers (cooperative_groups.h, curand_kernel.h) include
# <cuda/...> headers through them, which ones depending on the machine's CUDA version; a partial
# copy would mix two CCCL versions in one build.
FLASHINFER_CCCL_DIRS = ("cccl/cub", "cccl/libcudacxx/include", "cccl/thrust")
# The other include directories, in flashinfer's order (cpp_ext.get_system_includes): of these
# only the headers the modules' sources include, transitively, are kept (norm: 15, 2 sources).
FLASHINFER_INCLUDE_DIRS = (
    "include", "csrc", "cutlass/include", "cutlass/tools/util/include", "spdlog/include",
)  # fmt: skip
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
NIXL_LIBS = "nixl_cu13.libs"
# Where the bindings' own libraries (libnixl.so, libserdes.so: the RPATH's first entry) live;
# libnixl.so loads gRPC, etcd and abseil from NIXL_LIBS.
NIXL_MESON_LIBS = ".nixl_cu13.mesonpy.libs"


def locked() -> list[str]:
    return [
        line.split()[0]
        for line in LOCK.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def download(cache: Path) -> list[Path]:
    """The lock's wheels in `cache` (pip skips those already there, hashes checked)."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *platforms, "--require-hashes", "-r", str(LOCK), "-d", str(cache)],
        check=True,
    )  # fmt: skip
    wheels = []
    for req in locked():
        found = cached(cache, req)
        if len(found) != 1:
            raise SystemExit(f"bundle: expected one wheel for {req} in {cache}, found {found}")
        wheels.append(found[0])
    return wheels


def cached(cache: Path, req: str) -> list[Path]:
    """The wheels in `cache` of `req` (NAME==VERSION)."""
    name, version = req.split("==")
    pattern = re.compile(rf"^{re.sub('[-_.]', '[-_.]', name)}-{re.escape(version)}-", re.I)
    return [w for w in cache.glob("*.whl") if pattern.match(w.name)]


def unpack(wheels: list[Path], site: Path) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)


def elf_files(root: Path) -> Iterator[Path]:
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and ".so" in p.name:
            with p.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield p


def needed(lib: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def keep_needed(site: Path) -> None:
    """Drop the libraries in nixl_cu13.libs that nothing kept loads (the bindings and what
    they load through NIXL's meson libraries, the UCX and POSIX plugins and UCX's own
    transports, which UCX opens by directory)."""
    libs = site / NIXL_LIBS
    bundled = {p.name: p for p in libs.glob("*.so*")}
    found = {**bundled, **{p.name: p for p in (site / NIXL_MESON_LIBS).glob("*.so*")}}
    roots = [*(site / "nixl_cu13").glob("*.so"), *libs.glob("nixl/*.so"), *libs.glob("ucx/*.so*")]
    seen: set[str] = set()
    todo = [n for r in roots for n in needed(r)]
    while todo:
        name = todo.pop()
        if name in found and name not in seen:
            seen.add(name)
            todo += needed(found[name])
    for name, path in bundled.items():
        if name not in seen:
            path.unlink()


def jit_sources(site: Path, module: str) -> list[Path]:
    """The sources flashinfer/jit/MODULE.py's gen_MODULE_module compiles: the names it joins
    to FLASHINFER_CSRC_DIR."""
    text = (site / "flashinfer/jit" / f"{module}.py").read_text()
    names = re.findall(r'FLASHINFER_CSRC_DIR\s*/\s*"([^"]+)"', text)
    sources = [site / FLASHINFER_DATA / "csrc" / name for name in names]
    if not sources or not all(s.is_file() for s in sources):
        raise SystemExit(f"bundle: flashinfer/jit/{module}.py's sources are not {sources}")
    return sources


def included(data: Path, sources: list[Path]) -> set[Path]:
    """`sources` and every file under `data` they include, transitively, found as nvcc finds
    it: a quoted name beside the including file first, then each include directory in order;
    a name found in none is the CUDA toolkit's, the system's or tvm_ffi's. Every #include
    counts, whatever #if it stands under: a superset of what one build reads."""
    dirs = [data / d for d in (*FLASHINFER_CCCL_DIRS, *FLASHINFER_INCLUDE_DIRS)]
    seen: set[Path] = set()
    todo = list(sources)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for quote, name in INCLUDE.findall(path.read_text(errors="replace")):
            beside = [path.parent / name] if quote == '"' else []
            found = next((p for p in (*beside, *(d / name for d in dirs)) if p.is_file()), None)
            if found is not None:
                todo.append(Path(os.path.normpath(found)))
    return seen


def flashinfer_keep(site: Path) -> set[Path]:
    """What the bundle keeps of flashinfer/data: the CCCL include directories whole, and the
    FLASHINFER_JIT_MODULES' sources with what they include."""
    data = site / FLASHINFER_DATA
    cccl = {p for d in FLASHINFER_CCCL_DIRS for p in (data / d).rglob("*") if p.is_file()}
    if not cccl:
        raise SystemExit(f"bundle: no CCCL headers under {data} {FLASHINFER_CCCL_DIRS}")
    sources = [s for module in FLASHINFER_JIT_MODULES for s in jit_sources(site, module)]
    return cccl | included(data, sources)


def trim_flashinfer(site: Path) -> None:
    data = site / FLASHINFER_DATA
    keep = flashinfer_keep(site)
    for path in data.rglob("*"):
        if not path.is_dir() and path not in keep:
            path.unlink()
    # Children sort after their parent: reversed, each directory comes after its children.
    for path in sorted((p for p in data.rglob("*") if p.is_dir()), reverse=True):
        if not any(path.iterdir()):
            path.rmdir()


def drop(site: Path) -> None:
    for pattern in DROP:
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def trim(site: Path) -> None:
    drop(site)
    trim_flashinfer(site)
    keep_needed(site)
    for p in site.rglob("__pycache__"):
        shutil.rmtree(p)
    # Debug sections: smg's library alone drops from 106 to 75 MB.
    subprocess.run(["strip", "--strip-unneeded", *map(str, elf_files(site))], check=True)


def pack(site: Path, out: Path) -> Path:
    """tar | xz -9 on every core (Python's lzma is single-threaded: minutes longer), through
    xz's x86 filter: most of the bundle is x86-64 machine code (smg's library alone is 25 MiB
    packed), whose relative call addresses the filter makes absolute, and so repeated; 2.3 MiB
    less than without it. Any xz (`tar -xJf`) reads it back."""
    tar = out / "site.tar.xz"
    with tar.open("wb") as f:
        t = subprocess.Popen(["tar", "-C", str(site.parent), "-cf", "-", site.name],
                             stdout=subprocess.PIPE)  # fmt: skip
        subprocess.run(["xz", "-T0", "--x86", "--lzma2=preset=9"], stdin=t.stdout, stdout=f,
                       check=True)  # fmt: skip
        if t.wait():
            raise SystemExit("bundle: tar failed")
    return tar


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("build/gpu-bundle"))
    ap.add_argument("--cache", type=Path, default=CACHE)
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    wheels = download(args.cache)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        unpack(wheels, site)
        trim(site)
        unpacked = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
        tar = pack(site, args.out)
    lock = args.out / "bundle.lock"
    shutil.copyfile(LOCK, lock)
    mib = tar.stat().st_size / 2**20
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()
    (args.out / "SHA256SUMS").write_text(f"{digest}  site.tar.xz\n")
    size = f"{mib:.1f} MiB ({unpacked / 2**20:.0f} MiB unpacked)"
    print(f"bundle: {tar} {size}, {len(wheels)} wheels")
    if mib > LIMIT_MIB:
        raise SystemExit(f"bundle: {mib:.1f} MiB is over the {LIMIT_MIB} MiB a call carries")


if __name__ == "__main__":
    main()
