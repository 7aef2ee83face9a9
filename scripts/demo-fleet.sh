#!/usr/bin/env bash
# The fleet demo (`make demo-fleet`, after scripts/setup.sh): three systemd test hosts on one
# host bridge, site.yml over their one inventory with the sim fleet profile (2 pairs per host,
# an etcd member on every host, a gateway on hosts 1 and 2, monitoring on the first), a chat
# completion through each gateway, the store's health, and `pdctl status` of the whole fleet
# from this machine. Run as root. `make demo-fleet-down`
# removes the fleet.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FLEET=${PDSTACK_DEMO_FLEET:-pdfleet}  # `make demo-fleet-down` takes down pdfleet
SIZE=3  # three etcd members: the store survives losing any one host
# PDSTACK_DEMO_FLEET_PROFILE=deploy/profiles/sim-fleet-groups.yml: xPyD groups instead of pairs
# (a 2P1D group on every host, a 1P2D group across the three; its hosts are named pdfleet1-3).
PROFILE=$(realpath "${PDSTACK_DEMO_FLEET_PROFILE:-$ROOT/deploy/profiles/sim-fleet.yml}")
STATE=$ROOT/deploy/testhost/state
INVENTORY=$STATE/$FLEET/inventory.ini
SSH_CONFIG=$STATE/$FLEET/ssh_config
KEY_FILE=$STATE/demo-api-key
PLAYBOOK_TIMEOUT=${PDSTACK_DEMO_PLAYBOOK_TIMEOUT:-1800}
READY_TIMEOUT=${PDSTACK_DEMO_READY_TIMEOUT:-180}

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo-fleet: error: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/demo-lib.sh
. scripts/demo-lib.sh

[[ -x .venv/bin/ansible-playbook ]] || die "no .venv: run scripts/setup.sh first (or make demo-fleet)"

step "Booting the test fleet '$FLEET': $SIZE hosts on bridge br-$FLEET (2 pretend NUMA nodes each)"
if [[ -f $INVENTORY ]] && deploy/testhost/testhost status --name "${FLEET}1" >/dev/null 2>&1; then
  echo "already up: converging it again (site.yml is idempotent)"
else
  # Prometheus and node exporter baked into the root: the hosts have no package mirror.
  deploy/testhost/testhost fleet-up --fleet "$FLEET" --size "$SIZE" \
    --extra-packages "$(cat deploy/testhost/monitoring-packages)"
fi
cat "$INVENTORY"

demo_secrets  # scripts/demo-lib.sh

step "ansible-playbook site.yml over the fleet (profile: ${PROFILE#"$ROOT"/})"
echo "preflight on every host -> the coordination store (etcd on all three, mutual TLS) -> PD"
echo "engines (sim-fleet.yml: 2 pairs per host) -> a gateway on hosts 1 and 2, over all of them -> monitoring"
echo "on the first host"
demo_converge "$INVENTORY" "$PROFILE"

# Every gateway's URL, from the deployment (inventory + profile), as pdctl sees it.
mapfile -t GATEWAYS < <(.venv/bin/python -c '
import sys
from pathlib import Path
from pdctl.spec import load_deployment
dep = load_deployment(Path(sys.argv[1]), Path(sys.argv[2]))
print("\n".join(dep.gateway_url(g) for g in dep.gateways))' "$INVENTORY" "$PROFILE")

for gw in "${GATEWAYS[@]}"; do
  step "A chat completion through the gateway at $gw"
  deadline=$(( $(date +%s) + READY_TIMEOUT ))
  until curl -fsS -m 5 "$gw/readiness" >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || die "gateway $gw not ready after ${READY_TIMEOUT}s; on its host: journalctl -u pdstack-gateway"
    sleep 2
  done
  curl -fsS -m 60 "$gw/v1/chat/completions" \
    -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \
    -d '{"model": "sim-model", "messages": [{"role": "user", "content": "Hello from the fleet demo"}], "max_tokens": 24}' \
    | .venv/bin/python -m json.tool
done

step "The coordination store: every etcd member over TLS, from this machine (the controller's certificate)"
.venv/bin/python - "$INVENTORY" "$PROFILE" <<'PY' || true
import sys
from pathlib import Path
from pdctl.coord.health import member_health
from pdctl.ops.source import controller_topology
from pdctl.spec import load_deployment
coord = controller_topology(load_deployment(Path(sys.argv[1]), Path(sys.argv[2]))).coord
for m in member_health(coord):
    print(f"{'OK' if m.healthy else 'FAILED'}: {m.endpoint}: {m.detail}")
PY

step "pdctl status of the whole fleet, from this machine (ssh -F $SSH_CONFIG)"
PDCTL_SSH_CONFIG=$SSH_CONFIG PDSTACK_GATEWAY_API_KEY=$API_KEY COLUMNS=${COLUMNS:-100} \
  .venv/bin/pdctl status -i "$INVENTORY" -p "$PROFILE" || true

cat <<EOF

Done. Next:
  ssh -F $SSH_CONFIG ${FLEET}1              a root shell on the first host (${FLEET}2, ${FLEET}3: the others)
  PDCTL_SSH_CONFIG=$SSH_CONFIG PDSTACK_GATEWAY_API_KEY=\$(cat $KEY_FILE) \\
    .venv/bin/pdctl status -i $INVENTORY -p $PROFILE
  make demo-fleet-down                          remove the fleet
EOF
