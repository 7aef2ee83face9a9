#!/usr/bin/env bash
# Build the wheelhouse the hosts install from, offline: pdctl built from this checkout, its
# dependencies, and the requirements given (e.g. smg==1.13.0 sglang==0.5.23 nixl-cu12==1.5.1);
# those after --no-deps without their dependencies (the sim's nixl-cu12, whose own are torch and
# CUDA): deploy/wheelhouse.sh smg==1.13.0 --no-deps nixl-cu12==1.5.1.
# Prints the wheelhouse directory on stdout (progress goes to stderr): the wheels, wheels.tar
# holding them all (what site.yml copies), and a .complete marker holding wheels.tar's sha256
# (a host unpacks a wheelhouse it has not unpacked yet, known by that sum, without reading it).
#
# Cached by a hash of the requirements, pyproject.toml, the pdctl sources (with templates/) and
# the Python version and machine: wheels are built for the controller's Python, so it must match
# the hosts' (Debian bookworm: 3.11, x86_64). site.yml runs this itself when pdstack_wheelhouse is
# empty; run it by hand to pre-build one for an air-gapped cluster and pass its directory as
# -e pdstack_wheelhouse=DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PDSTACK_PYTHON:-$ROOT/.venv/bin/python}
CACHE=${PDSTACK_CACHE:-/var/cache/pdstack}/wheelhouse
KEEP=5  # wheelhouses kept; each source change of pdctl or package list makes a new one
TIMEOUT=${PDSTACK_WHEELHOUSE_TIMEOUT:-1800}

log() { printf 'wheelhouse: %s\n' "$*" >&2; }

[[ -x $PYTHON ]] || { log "error: no Python at $PYTHON (run scripts/setup.sh or set PDSTACK_PYTHON)"; exit 1; }
deps=() no_deps=()
for arg in "$@"; do
  if [[ $arg == --no-deps ]]; then no_deps+=(--no-deps)  # a separator; dropped below
  elif ((${#no_deps[@]})); then no_deps+=("$arg")
  else deps+=("$arg"); fi
done
no_deps=("${no_deps[@]:1}")

mkdir -p "$CACHE"
cd "$ROOT"

sources() { find pdctl templates -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | LC_ALL=C sort; }
key=$(
  {
    printf '%s\n' "${deps[@]}" | LC_ALL=C sort
    printf -- '--no-deps\n'
    printf '%s\n' "${no_deps[@]}" | LC_ALL=C sort
    cat pyproject.toml "${BASH_SOURCE[0]}"
    sources | xargs sha256sum
    "$PYTHON" -c 'import platform, sys; print(sys.version_info[:2], platform.machine())'
  } | sha256sum | cut -c1-16
)
dir=$CACHE/$key

exec 9> "$CACHE/.lock"
flock -w "$TIMEOUT" 9 || { log "error: timed out waiting for $CACHE/.lock"; exit 1; }

if [[ ! -e $dir/.complete ]]; then
  log "building $dir (${*:-pdctl only})"
  tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # Build from a copy: an in-tree build/ keeps modules deleted since the last build.
  mkdir -p "$tmp/src" "$tmp/wheels"
  cp pyproject.toml "$tmp/src/"
  [[ -e README.md ]] && cp README.md "$tmp/src/"
  sources | tar -cf - -T - | tar -xf - -C "$tmp/src"
  # A fixed epoch makes the pdctl wheel byte-identical for identical sources, so hosts only
  # reinstall it when its code changed.
  SOURCE_DATE_EPOCH=315532800 timeout "$TIMEOUT" "$PYTHON" -m pip wheel -q --no-deps \
    -w "$tmp/wheels" "$tmp/src" >&2
  timeout "$TIMEOUT" "$PYTHON" -m pip wheel -q -w "$tmp/wheels" "$tmp"/wheels/pdctl-*.whl \
    "${deps[@]}" >&2
  if ((${#no_deps[@]})); then
    timeout "$TIMEOUT" "$PYTHON" -m pip wheel -q --no-deps -w "$tmp/wheels" "${no_deps[@]}" >&2
  fi
  # One file to copy to each host (one checksum instead of one per wheel); fixed metadata so
  # equal wheels give an equal archive.
  (cd "$tmp/wheels" && find . -name '*.whl' -printf '%P\n' | LC_ALL=C sort \
    | tar --mtime=@315532800 --owner=0 --group=0 --numeric-owner -cf wheels.tar -T -)
  (cd "$tmp/wheels" && sha256sum wheels.tar | cut -d' ' -f1 > .complete)
  rm -rf "$dir"
  mv "$tmp/wheels" "$dir"
  log "built: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
  # Oldest first out; the one just built is the newest.
  find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' \
    | sort -rn | tail -n +$((KEEP + 1)) | cut -d' ' -f2- | xargs -r rm -rf
fi
echo "$dir"
