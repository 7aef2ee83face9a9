#!/usr/bin/env bash
# The GPU lane (docs/real-engine.md): a real SGLang 0.5.17 prefill/decode pair and smg 1.13.0
# on this machine's GPU, pdstack run against them, a record of what they said.
#
#   benchmarks/real_engine/run.sh [OUT_DIR]      # from the repository root; default build/real-engine
#
# Needs an NVIDIA GPU, Python 3.12 with a CUDA build of torch 2.11 (python3, or $PYTHON) and
# the bundle `make gpu-bundle` builds (build/gpu-bundle/site.tar.xz, or $PDSTACK_GPU_BUNDLE).
# Without any of them it says so in one line and exits 2 before starting anything.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
BUNDLE=${PDSTACK_GPU_BUNDLE:-build/gpu-bundle/site.tar.xz}
OUT=${1:-build/real-engine}
WORK=${PDSTACK_REAL_WORK:-/tmp/pdstack-real}

fail() { echo "run.sh: $*" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || fail "no NVIDIA GPU here (nvidia-smi lists none); the lane runs on a GPU machine"
[[ -f "$BUNDLE" ]] || fail "no bundle at $BUNDLE; build it with 'make gpu-bundle' where PyPI is reachable and copy build/gpu-bundle here"
"$PY" -c 'import sys, torch; sys.exit(sys.version_info[:2] != (3, 12) or not torch.cuda.is_available())' 2>/dev/null \
  || fail "$PY is not Python 3.12 with a CUDA build of torch"

rm -rf "$WORK" "$OUT"
mkdir -p "$WORK" "$OUT"
tar -xJf "$BUNDLE" -C "$WORK"
# The CUDA runtime libraries of the machine's nvidia-* Python packages (CUDA 13: nvidia/cu13/lib),
# which SGLang's kernels and NIXL load by name; nvcc's toolkit for Triton and NIXL.
libs=$("$PY" -c 'import glob, site; print(":".join(sorted({d for s in site.getsitepackages() for d in glob.glob(s + "/nvidia/*/lib") + glob.glob(s + "/nvidia/*/*/lib")})))')
export PYTHONPATH="$WORK/site:$PWD" LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME; fi
# pdctl reads an inventory with ansible-core; without it, PDSTACK_RENDERED names the
# `pdctl render -i benchmarks/real_engine/inventory.ini --format json` output made elsewhere.
exec "$PY" benchmarks/real_engine/lane.py --out "$OUT" ${PDSTACK_RENDERED:+--rendered "$PDSTACK_RENDERED"}
