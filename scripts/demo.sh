#!/usr/bin/env bash
# The demo (`make demo`, after scripts/setup.sh): a local systemd test host, site.yml with the
# GPU-free sim profile, a chat completion through the gateway over the PD path, and the units'
# status. Run as root. `make demo-down` removes the host.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

NAME=pdtest  # deploy/testhost/testhost's default, what `make demo-down` takes down
PROFILE=$ROOT/deploy/profiles/sim.yml
STATE=$ROOT/deploy/testhost/state
INVENTORY=$STATE/$NAME/inventory.ini
KEY_FILE=$STATE/demo-api-key
PLAYBOOK_TIMEOUT=${PDSTACK_DEMO_PLAYBOOK_TIMEOUT:-1200}
READY_TIMEOUT=${PDSTACK_DEMO_READY_TIMEOUT:-180}

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/demo-lib.sh
. scripts/demo-lib.sh
# ssh joins its arguments into one remote command line: quote each one.
on_host() { deploy/testhost/testhost ssh --name "$NAME" -- "$(printf '%q ' "$@")"; }

[[ -x .venv/bin/ansible-playbook ]] || die "no .venv: run scripts/setup.sh first (or make demo)"

step "Booting the systemd test host '$NAME' (Debian, systemd-nspawn)"
if deploy/testhost/testhost status --name "$NAME" >/dev/null 2>&1; then
  echo "already up: converging it again (site.yml is idempotent)"
else
  # Prometheus and node exporter baked into the root: the host has no package mirror.
  deploy/testhost/testhost up --name "$NAME" --extra-packages "$(cat deploy/testhost/monitoring-packages)"
fi

demo_secrets  # scripts/demo-lib.sh

step "ansible-playbook site.yml (profile: deploy/profiles/sim.yml)"
echo "preflight -> the coordination store (a one-member etcd, mutual TLS) -> PD engines (pair"
echo "target per prefill/decode) -> gateway -> monitoring (Grafana's"
echo "provisioning only: no Grafana package is reachable here); the first run builds"
echo "the wheelhouse the host installs from (cached in /var/cache/pdstack/wheelhouse)"
demo_converge "$INVENTORY" "$PROFILE"

# pdctl on the host reads the topology file site.yml wrote; no inventory needed there.
read_topology() {
  on_host /opt/pdstack/venv/bin/python -c "from pdctl import topology; t = topology.read(); $1"
}
# One host: one gateway.
GATEWAY=$(read_topology 'print(t.gateways[0].url)')
UNITS="$(read_topology 'print(" ".join([p.target for p in t.pairs] + [i.unit for i in t.instances] + [g.unit for g in t.gateways]))') pdstack-etcd.service"

step "Waiting for the gateway at $GATEWAY to see a healthy prefill and decode (timeout ${READY_TIMEOUT}s)"
deadline=$(( $(date +%s) + READY_TIMEOUT ))
until curl -fsS -m 5 "$GATEWAY/readiness" >/dev/null 2>&1; do
  (( $(date +%s) < deadline )) || die "gateway not ready after ${READY_TIMEOUT}s; on the host: journalctl -u pdstack-gateway"
  printf '.'
  sleep 2
done
echo " ready: $(curl -fsS -m 5 "$GATEWAY/readiness")"

step "A chat completion through the gateway (prefill and decode over the PD path)"
echo "POST $GATEWAY/v1/chat/completions"
curl -fsS -m 60 "$GATEWAY/v1/chat/completions" \
  -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \
  -d '{"model": "sim-model", "messages": [{"role": "user", "content": "Hello from the demo"}], "max_tokens": 24}' \
  | .venv/bin/python -m json.tool

step "pdctl status on the host (units, engines, the pair's PD path, the gateway's view)"
on_host env COLUMNS=160 PDSTACK_GATEWAY_API_KEY="$API_KEY" pdctl status || true

step "The coordination store: the etcd member's health over TLS, with the host's client certificate"
on_host etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/pdstack/etcd/ca.crt \
  --cert=/etc/pdstack/etcd/client.crt --key=/etc/pdstack/etcd/client.key endpoint status -w table || true

step "Prometheus on the host: scrape targets"
sleep 5  # let Prometheus finish its first scrape of the new targets
on_host curl -fsS -m 5 'http://127.0.0.1:9090/api/v1/targets?state=active' \
  | .venv/bin/python -c 'import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print("  %-12s %-8s %s" % (t["labels"]["job"], t["health"], t["scrapeUrl"]))' || true

step "Status of the units on the host"
# systemctl status exits 3 when a unit is inactive; the printout is what matters here.
# UNITS: unit names without spaces, one word each.
# shellcheck disable=SC2086
on_host systemctl status --no-pager --lines=3 $UNITS || true

cat <<EOF

Done. Next:
  deploy/testhost/testhost ssh --name $NAME      a root shell on the host (units: $UNITS)
  deploy/testhost/testhost ssh --name $NAME -- pdctl status   pdctl on the host, by name
  curl -H "Authorization: Bearer \$(cat $KEY_FILE)" $GATEWAY/v1/models
  make demo-down                                  remove the test host
EOF
