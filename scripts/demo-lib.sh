# shellcheck shell=bash
# Shared by scripts/demo.sh and scripts/demo-fleet.sh (sourced after they set STATE, KEY_FILE,
# PLAYBOOK_TIMEOUT and define die).

# The gateway's API key and Grafana's admin password: secret variables, kept out of the
# repository and the unit files, made once per checkout.
demo_secrets() {
  mkdir -p "$STATE"
  [[ -s $KEY_FILE ]] || (umask 077 && head -c 24 /dev/urandom | base64 | tr '+/' '-_' > "$KEY_FILE")
  API_KEY=$(cat "$KEY_FILE")
  GRAFANA_FILE=$STATE/demo-grafana-password
  [[ -s $GRAFANA_FILE ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr '+/' '-_' > "$GRAFANA_FILE")
}

# site.yml over INVENTORY with PROFILE (Grafana's provisioning only: no Grafana package is
# reachable from a test host), bounded by PLAYBOOK_TIMEOUT.
demo_converge() {
  local inventory=$1 profile=$2 start
  start=$(date +%s)
  timeout "$PLAYBOOK_TIMEOUT" .venv/bin/ansible-playbook site.yml -i "$inventory" \
    -e "pdstack_profile=$profile" -e "pdstack_gateway_api_key=$API_KEY" \
    -e pdstack_grafana_install=false -e "pdstack_grafana_admin_password=$(cat "$GRAFANA_FILE")" \
    || die "site.yml failed (exit $?); see the output above"
  echo "converged in $(( $(date +%s) - start ))s"
}
