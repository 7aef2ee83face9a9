#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine (root): system packages, the project venv with the
# gateway, and the cached environment holding SGLang's real argument parser.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${PDSTACK_CACHE:-/var/cache/pdstack}
mkdir -p "$CACHE"
# Checkouts share the Debian packages and the cached environments below: two set-ups at once
# (worktrees, a CI clone beside a checkout) would race apt and rebuild each other's SGLang
# parser environment. The venv is per checkout and the test host roots have a lock of their own.
exec 7>"$CACHE/.setup.lock"
flock -w 1800 7 || { echo "setup: timed out waiting for $CACHE/.setup.lock" >&2; exit 1; }

APT_PACKAGES=(python3-venv debootstrap systemd-container iproute2 openssh-client
              prometheus prometheus-node-exporter make nftables shellcheck etcd-server etcd-client
              rsync)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The distribution starts these on install; tests run their own instances.
  systemctl disable --now prometheus prometheus-node-exporter etcd >/dev/null 2>&1 || true
fi

# What builds in the background, beside the project venv: on a cold machine each mostly waits on
# a mirror (the test host roots 1-2 minutes each), so they overlap. A failed step still waits
# for them (no debootstrap or pip is left running); each must succeed.
pids=() whats=()
background() { local what=$1; shift; "$@" & pids+=($!); whats+=("$what"); }
trap 'wait' EXIT

# The Debian roots of the systemd test host, built once and cached by their package lists:
# plain (e2e tests) and with Prometheus baked in (the demo and the monitoring tests; the host
# has no route to a package mirror).
background "the test host root" deploy/testhost/testhost build
background "the monitoring test host root" \
  deploy/testhost/testhost build --extra-packages "$(cat deploy/testhost/monitoring-packages)"

# SGLang's own parser: the pinned sglang without its GPU dependencies, cached across runs.
sg_stamp=$(cat requirements/sglang.txt requirements/sglang-parser.txt | sha256sum | cut -c1-16)
SGENV="$CACHE/sglang-parser-$sg_stamp"
sglang_parser_env() {
  echo "setup: building the SGLang parser environment in $SGENV (once per machine)"
  rm -rf "$SGENV"
  python3 -m venv "$SGENV"
  "$SGENV/bin/pip" install -q -r requirements/sglang-parser.txt
  "$SGENV/bin/pip" install -q --no-deps -r requirements/sglang.txt
  "$SGENV/bin/python" -c "import sglang.srt.server_args"
  touch "$SGENV/.complete"
}
[[ -e "$SGENV/.complete" ]] || background "the SGLang parser environment" sglang_parser_env

# The project venv: pdctl (editable), dev tools, the pinned gateway, and NIXL for the sim's
# nixl backend (without its torch/CUDA dependencies).
stamp=$(cat pyproject.toml requirements/gateway.txt requirements/nixl-sim.txt | sha256sum | cut -c1-16)
if [[ ! -x .venv/bin/pdctl || "$(cat .venv/.stamp 2>/dev/null)" != "$stamp" ]]; then
  echo "setup: building .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,controller]' -r requirements/gateway.txt
  .venv/bin/pip install -q --no-deps -r requirements/nixl-sim.txt
  .venv/bin/python -c "from nixl_cu12._api import nixl_agent, nixl_agent_config"
  echo "$stamp" > .venv/.stamp
fi

for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "setup: building ${whats[$i]} failed (above)" >&2; exit 1; }
done
ln -sfn "$SGENV" "$CACHE/sglang-parser"
echo "setup: ready"
