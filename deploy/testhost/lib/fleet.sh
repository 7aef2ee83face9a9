# shellcheck shell=bash disable=SC2034  # NAME: read by the other files of testhost
# Sourced by deploy/testhost/testhost:
# fleets: fleet-up, fleet-down.

# ------------------------------------------------------------------------------- fleets
# A fleet: hosts FLEET1..FLEETN on bridge br-FLEET, one inventory and one ssh config for all.
fleet_dir() { echo "$STATE_DIR/$FLEET"; }
fleet_bridge() { echo "br-$FLEET"; }
# Boots at once: the machine building and booting them is usually small.
FLEET_PARALLEL=${PDSTACK_TESTHOST_FLEET_PARALLEL:-3}

cmd_fleet_up() {
  need_root; check_fleet; check_bridge
  need_tools debootstrap systemd-nspawn ip ssh ssh-keygen nsenter setsid flock timeout sha256sum
  local fd t0 hosts=() i h failed=() pids=() batch; fd=$(fleet_dir); t0=$(now)
  for ((i = 1; i <= FLEET_SIZE; i++)); do hosts+=("$FLEET$i"); done
  [[ -f $fd/hosts ]] &&
    die "fleet '$FLEET' is already up ($(paste -sd ' ' "$fd/hosts")); use '$PROG fleet-down --fleet $FLEET' first"
  [[ -d $RUN_DIR/$FLEET || -d $fd ]] && die "'$FLEET' is the name of a test host; pick another fleet name"
  mkdir -p "$fd"
  printf '%s\n' "${hosts[@]}" > "$fd/hosts"  # first: fleet-down finds what a failed fleet-up left
  build_pristine  # once, not in every parallel 'up'
  log "booting fleet '$FLEET': ${hosts[*]} on bridge $(fleet_bridge) ($NUMA_NODES NUMA nodes each)"
  local up=("$HERE/$PROG" up --bridge "$(fleet_bridge)" --numa-nodes "$NUMA_NODES" --timeout "$BOOT_TIMEOUT")
  [[ -n $EXTRA_PACKAGES_RAW ]] && up+=(--extra-packages "$EXTRA_PACKAGES_RAW")
  ((QUIET)) && up+=(-q)
  for ((i = 0; i < ${#hosts[@]}; i += FLEET_PARALLEL)); do
    batch=("${hosts[@]:i:FLEET_PARALLEL}"); pids=()
    for h in "${batch[@]}"; do "${up[@]}" --name "$h" & pids+=($!); done
    for ((h = 0; h < ${#pids[@]}; h++)); do wait "${pids[h]}" || failed+=("${batch[h]}"); done
    ((${#failed[@]} == 0)) || break
  done
  if ((${#failed[@]})); then
    warn "fleet '$FLEET': ${failed[*]} did not come up; taking the fleet down"
    cmd_fleet_down
    exit 1
  fi
  for h in "${hosts[@]}"; do echo "$FLEET" > "$RUN_DIR/$h/fleet"; done
  write_fleet_files "${hosts[@]}"
  log "fleet '$FLEET' is up in $(( $(now) - t0 ))s: ${hosts[*]}"
  log "inventory: $fd/inventory.ini; ssh: ssh -F $fd/ssh_config ${hosts[0]}"
}

write_fleet_files() {  # $@ = hosts
  local fd h controller="" lines=() routers; fd=$(fleet_dir)
  : > "$fd/ssh_config.tmp"
  for h in "$@"; do
    NAME=$h
    controller=$(read_state host_address)
    # The controller runs pdctl status and bench against the engines: their firewall lets it in.
    lines+=("$h ansible_host=$(read_state address) pdstack_engine_firewall_allow=\"['$controller']\"")
    cat >> "$fd/ssh_config.tmp" <<EOF
Host $h $(read_state address)
  HostName $(read_state address)
  User root
  IdentityFile $STATE_DIR/$h/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $STATE_DIR/$h/known_hosts
  StrictHostKeyChecking yes
  ServerAliveInterval 5
  ServerAliveCountMax 3
EOF
  done
  mv "$fd/ssh_config.tmp" "$fd/ssh_config"
  routers=("${@:1:2}")
  # An odd number of store members: all hosts, or all but the last (two tolerate no loss).
  local members=("$@")
  (( ${#members[@]} % 2 )) || members=("${@:1:$#-1}")
  cat > "$fd/inventory.ini.tmp" <<EOF
# pdstack test fleet '$FLEET' on bridge $(fleet_bridge) - written by deploy/testhost/$PROG fleet-up;
# removed by fleet-down. ssh (Ansible, and pdctl with PDCTL_SSH_CONFIG) uses $fd/ssh_config.
[testhost]
$(printf '%s\n' "${lines[@]}")

[testhost:vars]
ansible_ssh_common_args='-F $fd/ssh_config'
ansible_user=root
ansible_python_interpreter=/usr/bin/python3
pdstack_testhost_init=systemd
pdstack_testhost_fleet=$FLEET

[pd_hosts]
$(printf '%s\n' "$@")

# Every [router] host runs a gateway over all pairs: two of them is the HA layout.
[router]
$(printf '%s\n' "${routers[@]}")

[monitoring]
$1

# The coordination store: every host when their number is odd (three survive losing one).
[etcd]
$(printf '%s\n' "${members[@]}")
EOF
  mv "$fd/inventory.ini.tmp" "$fd/inventory.ini"
}

cmd_fleet_down() {
  need_root; check_fleet
  local fd h hosts=() rc=0; fd=$(fleet_dir)
  [[ -f $fd/hosts ]] && mapfile -t hosts < "$fd/hosts"
  # Hosts recorded as members even without the fleet's state.
  for h in "$RUN_DIR"/*/fleet; do
    [[ -f $h && $(cat "$h") == "$FLEET" ]] || continue
    h=${h%/fleet}; h=${h##*/}
    [[ " ${hosts[*]} " == *" $h "* ]] || hosts+=("$h")
  done
  if ((${#hosts[@]} == 0)); then
    log "fleet '$FLEET' is not up; nothing to do"
    return 0
  fi
  for h in "${hosts[@]}"; do
    # shellcheck disable=SC2046  # unquoted on purpose: no word at all without --quiet
    "$HERE/$PROG" down --name "$h" --timeout "$STOP_TIMEOUT" $( ((QUIET)) && echo -q) || rc=1
  done
  ((rc == 0)) || die "some hosts of fleet '$FLEET' did not go down; see above, then re-run fleet-down"
  rm -rf "$fd"
  log "fleet '$FLEET' is down"
}

