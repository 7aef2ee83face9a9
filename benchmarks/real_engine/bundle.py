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
PLATFORMS = (
    "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "any",
)  # fmt: skip
LIMIT_MIB = 60  # 64 MiB a call, less the repository itself (3.5 MiB) and a little room

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
    # flashinfer's JIT sources (CUDA/CUTLASS headers): the lane compiles no flashinfer kernel
    # (Triton attention, PyTorch sampling), and its module paths only name the directory.
    "flashinfer/data": "JIT sources",
    # jedi's typeshed stubs are read when IPython completes code; sglang.utils imports
    # IPython.display, which imports jedi.
    "jedi/third_party": "type stubs",
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
        name, version = req.split("==")
        pattern = re.compile(rf"^{re.sub('[-_.]', '[-_.]', name)}-{re.escape(version)}-", re.I)
        found = [w for w in cache.glob("*.whl") if pattern.match(w.name)]
        if len(found) != 1:
            raise SystemExit(f"bundle: expected one wheel for {req} in {cache}, found {found}")
        wheels.append(found[0])
    return wheels


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


def trim(site: Path) -> None:
    for pattern in DROP:
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    keep_needed(site)
    for p in site.rglob("__pycache__"):
        shutil.rmtree(p)
    # Debug sections: smg's library alone drops from 106 to 75 MB.
    subprocess.run(["strip", "--strip-unneeded", *map(str, elf_files(site))], check=True)


def pack(site: Path, out: Path) -> Path:
    """tar | xz -9 on every core (Python's lzma is single-threaded: minutes longer)."""
    tar = out / "site.tar.xz"
    with tar.open("wb") as f:
        t = subprocess.Popen(["tar", "-C", str(site.parent), "-cf", "-", site.name],
                             stdout=subprocess.PIPE)  # fmt: skip
        subprocess.run(["xz", "-9", "-T0"], stdin=t.stdout, stdout=f, check=True)
        if t.wait():
            raise SystemExit("bundle: tar failed")
    return tar


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("build/gpu-bundle"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/pdstack/gpu-wheels")
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
