# shellcheck shell=bash
# Sourced by deploy/testhost/testhost:
# one host: up, down, status, list, ssh, exec, cache-clean.

# ---------------------------------------------------------------------------------- up
cmd_up() {
  need_root; check_name; not_a_fleet; check_bridge
  need_tools debootstrap systemd-nspawn ip ssh ssh-keygen nsenter setsid flock timeout sha256sum
  [[ $INIT == systemd || $INIT == none ]] || die "bad --init '$INIT': use systemd or none"
  local t0; t0=$(now)
  mkdir -p "$RUN_DIR" "$LIB_DIR" "$STATE_DIR"

  build_pristine
  local pristine; pristine=$(pristine_dir)

  exec 9>"$RUN_DIR/.lock"
  flock -w "$LOCK_TIMEOUT" 9 || die "timed out waiting for $RUN_DIR/.lock (another up/down running?)"

  local rd sd root; rd=$(rundir); sd=$(statedir); root=$(rootfs)
  if [[ -d $rd ]]; then
    if host_running; then
      die "test host '$NAME' is already up ($(read_state address)); use '$PROG down --name $NAME' first"
    fi
    log "cleaning up stale state of '$NAME'"
    teardown_locked
  fi
  local link; link=$(host_link)
  if ip link show "$link" >/dev/null 2>&1; then
    die "link $link already exists but no test host '$NAME' is recorded; remove it with: ip link del $link"
  fi

  # From here on a failed or interrupted 'up' takes down what it started.
  UP_DONE=0
  trap up_exit EXIT
  trap 'exit 130' INT TERM

  local slot a b host_ip guest_ip prefix_len K
  mkdir -p "$rd" "$sd"
  if [[ -n $BRIDGE ]]; then
    ensure_bridge
    # Recorded first: a failed 'up' releases the bridge it may have created.
    echo "$BRIDGE" > "$rd/bridge"
    host_ip="$BRIDGE_PREFIX.$K.1"; guest_ip=$(allocate_bridge_address "$K"); prefix_len=24
  else
    slot=$(allocate_slot); a=$((slot / 64)); b=$(((slot % 64) * 4))
    host_ip="$NET_PREFIX.$a.$((b + 1))"; guest_ip="$NET_PREFIX.$a.$((b + 2))"; prefix_len=30
    echo "$slot" > "$rd/slot"
  fi
  echo "$guest_ip" > "$rd/address"
  echo "$host_ip" > "$rd/host_address"
  echo "$INIT" > "$rd/init"
  echo "$root" > "$rd/rootfs"

  # A fresh copy of the pristine root.
  local t1; t1=$(now)
  rm -rf --one-file-system "${LIB_DIR:?}/${NAME:?}"
  mkdir -p "$LIB_DIR/$NAME"
  cp -a --reflink=auto "$pristine/rootfs" "$root"
  log "copied the root to $root in $(( $(now) - t1 ))s"

  # Identity: hostname, machine id, host keys, the client key.
  local mid; mid=$(tr -d '-' < /proc/sys/kernel/random/uuid)
  echo "$mid" > "$root/etc/machine-id"
  echo "$NAME" > "$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n%s\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$NAME" "$guest_ip" "$NAME" > "$root/etc/hosts"
  ssh-keygen -q -t ed25519 -N '' -C "root@$NAME" -f "$root/etc/ssh/ssh_host_ed25519_key"
  rm -f "$sd/id_ed25519" "$sd/id_ed25519.pub"
  ssh-keygen -q -t ed25519 -N '' -C "pdstack-testhost-$NAME" -f "$sd/id_ed25519"
  install -m 600 "$sd/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
  echo "$guest_ip $(cut -d' ' -f1,2 "$root/etc/ssh/ssh_host_ed25519_key.pub")" > "$sd/known_hosts"
  # Offer only the pinned key type so the known_hosts entry always matches.
  printf 'HostKey /etc/ssh/ssh_host_ed25519_key\n' > "$root/etc/ssh/sshd_config.d/20-pdstack-hostkey.conf"
  # What the host knows about itself (for scripts run on it).
  mkdir -p "$root/etc/pdstack-testhost"
  printf 'name=%s\naddress=%s\ncontroller=%s\n' "$NAME" "$guest_ip" "$host_ip" > "$root/etc/pdstack-testhost/info"

  # Boot.
  local nspawn_args=(-D "$root" -M "$NAME" --uuid="$mid" --register=no --keep-unit
                     --link-journal=no --console=read-only --kill-signal=SIGRTMIN+4)
  if [[ -n $BRIDGE ]]; then nspawn_args+=(--network-bridge="$BRIDGE"); else nspawn_args+=(--network-veth); fi
  if ((NUMA_NODES > 1)); then
    write_numa_tree "$root$NUMA_TREE"
    install_numactl_shim "$root"
    echo "$NUMA_NODES" > "$rd/numa_nodes"
  fi
  local init_args
  if [[ $INIT == systemd ]]; then
    init_args=(-b)
  else
    # No systemd: nspawn's stub init runs sshd as PID 2 (for the "missing systemd" preflight test).
    init_args=(--as-pid2 /bin/sh -c 'mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e')
  fi
  log "booting '$NAME' (init: $INIT) with systemd-nspawn"
  # (Our lock descriptors must not leak into the long-lived nspawn process.)
  TERM=dumb setsid systemd-nspawn "${nspawn_args[@]}" "${init_args[@]}" < /dev/null > "$rd/console.log" 2>&1 8>&- 9>&- &
  local np=$!
  echo "$np" > "$rd/nspawn.pid"
  local st; st=$(proc_starttime "$np"); echo "$st" > "$rd/nspawn.start"

  # The leader (the host's PID 1) and its veth (on the bridge: nspawn adds vb-NAME to it).
  local deadline=$(( $(now) + 30 )) leader=""
  while :; do
    kill -0 "$np" 2>/dev/null || { console_tail; die "systemd-nspawn exited during start (see $rd/console.log)"; }
    leader=$(find_leader "$np" || true)
    if [[ -n $leader ]] && nsenter -t "$leader" -n ip link show host0 >/dev/null 2>&1 &&
       ip link show "$link" >/dev/null 2>&1; then
      break
    fi
    (( $(now) < deadline )) || { console_tail; die "no container leader / veth after 30s (see $rd/console.log)"; }
    sleep 0.2
  done
  echo "$leader" > "$rd/leader.pid"
  proc_starttime "$leader" > "$rd/leader.start"
  if ((NUMA_NODES > 1)); then
    nsenter -t "$leader" -m -r mount --bind "$NUMA_TREE" /sys/devices/system/node
    nsenter -t "$leader" -m -r mount -o remount,bind,ro /sys/devices/system/node
    log "pretend NUMA nodes: $(cd "$root$NUMA_TREE" && for n in node*; do printf '%s:%s ' "$n" "$(cat "$n/cpulist")"; done)"
  fi

  [[ -z $BRIDGE ]] && ip addr add "$host_ip/30" dev "$link"
  ip link set "$link" up
  nsenter -t "$leader" -n ip addr add "$guest_ip/$prefix_len" dev host0
  nsenter -t "$leader" -n ip link set host0 up
  nsenter -t "$leader" -n ip link set lo up
  if [[ -n $BRIDGE ]]; then
    # The bridge's /24 is on link: no route beyond it, no forwarding.
    log "network: host0 $guest_ip/24 on bridge $BRIDGE (controller $host_ip)"
  else
    # Other test hosts are reached through the controller (needs net.ipv4.ip_forward=1 there).
    nsenter -t "$leader" -n ip route add "$NET_PREFIX.0.0/16" via "$host_ip" dev host0
    log "network: $link $host_ip/30 <-> host0 $guest_ip/30"
  fi
  # Recorded and addressed: other hosts' up/down need not wait for this one to boot.
  exec 9>&-

  # Wait for ssh and the system state.
  local tb; tb=$(now)
  deadline=$(( tb + BOOT_TIMEOUT ))
  local last_report=$tb state="" out
  while :; do
    if ! kill -0 "$np" 2>/dev/null; then
      console_tail; die "the test host stopped while booting (see $rd/console.log)"
    fi
    if [[ $INIT == systemd ]]; then
      out=$(run_ssh systemctl is-system-running 2>&1) && state=$out || state=${out:-no answer}
      state=${state##*$'\n'}
      [[ $state == running || $state == degraded ]] && break
    else
      run_ssh true >/dev/null 2>&1 && { state="ssh up"; break; }
      state="ssh not answering"
    fi
    if (( $(now) >= deadline )); then
      console_tail
      die "'$NAME' not ready after ${BOOT_TIMEOUT}s (last state: $state); a slow machine may need --timeout"
    fi
    if (( $(now) - last_report >= 5 )); then
      log "  waiting for '$NAME' to boot ($(( $(now) - tb ))s of ${BOOT_TIMEOUT}s): $state"
      last_report=$(now)
    fi
    sleep 0.5
  done
  if [[ $state == degraded ]]; then
    warn "'$NAME' is degraded; failed units: $(run_ssh systemctl --failed --no-legend --plain 2>/dev/null | awk '{ print $1 }' | tr '\n' ' ')"
  fi

  write_inventory "$guest_ip"
  UP_DONE=1
  log "'$NAME' is up in $(( $(now) - t0 ))s: $state, ssh root@$guest_ip"
  log "inventory: $sd/inventory.ini"
}

up_exit() {
  local rc=$?
  ((UP_DONE)) && return
  trap - EXIT INT TERM
  if [[ ${PDSTACK_TESTHOST_KEEP_FAILED:-} == 1 ]]; then
    warn "'$NAME' did not come up; left as it is for debugging (PDSTACK_TESTHOST_KEEP_FAILED=1): $PROG status|exec|down --name $NAME"
  else
    warn "'$NAME' did not come up; taking it down (set PDSTACK_TESTHOST_KEEP_FAILED=1 to keep it for debugging)"
    local console; console="$(rundir)/console.log"
    [[ -s $console ]] && cp "$console" "$RUN_DIR/$NAME.failed-console.log" &&
      warn "its console log is kept in $RUN_DIR/$NAME.failed-console.log"
    exec 9>"$RUN_DIR/.lock"
    flock -w 60 9 || warn "could not take $RUN_DIR/.lock; cleaning up anyway"
    STOP_TIMEOUT=10 teardown_locked || true
  fi
  exit "$rc"
}

write_inventory() {
  local ip=$1 sd; sd=$(statedir)
  cat > "$sd/inventory.ini.tmp" <<EOF
# pdstack test host '$NAME' - written by deploy/testhost/$PROG up; removed by down.
[testhost]
$NAME ansible_host=$ip

[testhost:vars]
ansible_user=root
ansible_ssh_private_key_file=$sd/id_ed25519
ansible_ssh_common_args='-o UserKnownHostsFile=$sd/known_hosts -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ServerAliveInterval=5 -o ServerAliveCountMax=3'
ansible_python_interpreter=/usr/bin/python3
pdstack_testhost_init=$INIT

[pd_hosts]
$NAME

[router]
$NAME

[monitoring]
$NAME

[etcd]
$NAME
EOF
  mv "$sd/inventory.ini.tmp" "$sd/inventory.ini"
  ln -sfn "$NAME/inventory.ini" "$STATE_DIR/inventory.ini"
}

# -------------------------------------------------------------------------------- down
cmd_down() {
  need_root; check_name; not_a_fleet
  mkdir -p "$RUN_DIR"
  local t0; t0=$(now)
  stop_host
  exec 9>"$RUN_DIR/.lock"
  flock -w "$LOCK_TIMEOUT" 9 || die "timed out waiting for $RUN_DIR/.lock (another up/down running?)"
  if [[ ! -d $(rundir) && ! -d $LIB_DIR/$NAME && ! -d $(statedir) ]]; then
    log "'$NAME' is not up; nothing to do"
    return 0
  fi
  teardown_locked
  log "'$NAME' is down ($(( $(now) - t0 ))s)"
  exec 9>&-
}

# Stop the host's container and wait for it (STOP_TIMEOUT, then SIGKILL). Needs no lock: it
# touches this host's processes only, so 'down' runs it before taking $RUN_DIR/.lock and other
# hosts' up/down do not wait out this host's stop.
stop_host() {
  local np leader
  np=$(read_state nspawn.pid); leader=$(read_state leader.pid)
  if pid_is_ours nspawn || pid_is_ours leader; then
    local deadline=$(( $(now) + STOP_TIMEOUT )) asked=""
    # Orderly: poweroff inside (closes SSH sessions cleanly), else the poweroff signal to PID 1,
    # else SIGTERM to systemd-nspawn (which forwards its kill signal, SIGRTMIN+4).
    local SSH=()
    [[ -n $(read_state address) ]] && ssh_argv
    if [[ $(read_state init) == systemd && ${#SSH[@]} -gt 0 ]] && pid_is_ours nspawn &&
       timeout 10 "${SSH[@]}" systemctl --no-block poweroff >/dev/null 2>&1; then
      asked="ssh poweroff"
    elif pid_is_ours leader && kill -s SIGRTMIN+4 "$leader" 2>/dev/null; then
      asked="SIGRTMIN+4 to PID $leader"
      [[ $(read_state init) == none ]] && pid_is_ours nspawn && kill -TERM "$np" 2>/dev/null
    elif pid_is_ours nspawn && kill -TERM "$np" 2>/dev/null; then
      asked="SIGTERM to systemd-nspawn $np"
    fi
    pid_is_ours nspawn || warn "systemd-nspawn of '$NAME' is gone but its PID 1 ($leader) is alive"
    log "stopping '$NAME' (${asked:-no request}); waiting up to ${STOP_TIMEOUT}s"
    local last_report; last_report=$(now)
    while pid_is_ours nspawn || pid_is_ours leader; do
      if (( $(now) >= deadline )); then
        warn "'$NAME' did not stop within ${STOP_TIMEOUT}s; SIGKILL to PIDs $leader $np"
        pid_is_ours leader && kill -KILL "$leader" 2>/dev/null
        pid_is_ours nspawn && kill -KILL "$np" 2>/dev/null
        local kd=$(( $(now) + 10 ))
        while { pid_is_ours nspawn || pid_is_ours leader; } && (( $(now) < kd )); do sleep 0.2; done
        pid_is_ours nspawn && die "systemd-nspawn PID $np survived SIGKILL"
        pid_is_ours leader && die "PID 1 of '$NAME' ($leader) survived SIGKILL"
        break
      fi
      if (( $(now) - last_report >= 5 )); then log "  still stopping ($(( $(now) - t0 ))s)"; last_report=$(now); fi
      sleep 0.2
    done
  fi
}

teardown_locked() {
  local rd; rd=$(rundir)
  stop_host
  # The veth goes with the namespace; remove it if something kept it.
  local link br d=$(( $(now) + 10 )); link=$(host_link); br=$(read_state bridge)
  while ip link show "$link" >/dev/null 2>&1 && (( $(now) < d )); do sleep 0.2; done
  if ip link show "$link" >/dev/null 2>&1; then
    warn "$link still present; deleting it"
    ip link del "$link" 2>/dev/null || true
  fi
  # The rootfs copy: never follow a mount out of it.
  local root="$LIB_DIR/$NAME"
  if [[ -d $root ]]; then
    if awk -v p="$root/" 'index($2 "/", p) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
      die "something is still mounted under $root; unmount it and re-run down"
    fi
    rm -rf --one-file-system "$root"
  fi
  rm -rf "$rd" "$(statedir)"
  release_bridge "$br"
  if [[ -L $STATE_DIR/inventory.ini && $(readlink "$STATE_DIR/inventory.ini") == "$NAME/inventory.ini" ]]; then
    rm -f "$STATE_DIR/inventory.ini"
  fi
}

t0=0
UP_DONE=1
# ------------------------------------------------------------------------------ helpers
cmd_status() {
  check_name
  local rd; rd=$(rundir)
  if [[ ! -d $rd ]]; then echo "$NAME: down"; return 3; fi
  local np leader; np=$(read_state nspawn.pid); leader=$(read_state leader.pid)
  if ! host_running; then
    echo "$NAME: broken (recorded but not running: nspawn $np, leader $leader); run: $PROG down --name $NAME"
    return 1
  fi
  local sys where numa fleet
  where=$(read_state bridge); where=${where:+bridge $where}; where=${where:-ve-$NAME}
  numa=$(read_state numa_nodes); fleet=$(read_state fleet)
  if [[ $(read_state init) == systemd ]]; then
    sys=$(run_ssh systemctl is-system-running 2>/dev/null) || sys=${sys:-"no ssh answer"}
  else
    sys=$(run_ssh true >/dev/null 2>&1 && echo "ssh up (no systemd)" || echo "no ssh answer")
  fi
  cat <<EOF
$NAME: up
  address     $(read_state address) (controller side: $(read_state host_address) on $where)
  init        $(read_state init)
  numa nodes  ${numa:-"the controller's"}
  fleet       ${fleet:--}
  system      $sys
  pids        systemd-nspawn $np, PID 1 $leader
  uptime      $(ps -o etime= -p "$leader" | tr -d ' ')
  inventory   $(statedir)/inventory.ini
  ssh key     $(statedir)/id_ed25519
  rootfs      $(read_state rootfs)
  console     $rd/console.log
EOF
}

cmd_list() {
  local d n br fl
  for d in "$RUN_DIR"/*/; do
    [[ -d $d ]] || continue
    n=$(basename "$d")
    NAME=$n
    if host_running; then
      br=$(read_state bridge); fl=$(read_state fleet)
      echo "$n up $(read_state address)${br:+ bridge $br}${fl:+ fleet $fl}"
    else
      echo "$n broken"
    fi
  done
}

cmd_ssh() {
  check_name
  host_running || die "test host '$NAME' is not up (start it: $PROG up --name $NAME)"
  if (($#)); then run_ssh -- "$@"; else run_ssh -t; fi
}

cmd_exec() {
  need_root; check_name
  host_running || die "test host '$NAME' is not up (start it: $PROG up --name $NAME)"
  (($#)) || die "exec needs a command: $PROG exec --name $NAME -- CMD..."
  local leader; leader=$(read_state leader.pid)
  nsenter -t "$leader" -m -u -i -n -p -r -w \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    TERM="${TERM:-dumb}" LANG=C.UTF-8 "$@"
}

cmd_cache_clean() {
  need_root
  local keep d; keep=$(pristine_dir)
  for d in "$CACHE_DIR"/*/; do
    d=${d%/}
    [[ -d $d && $d != "$keep" ]] || continue
    log "removing $d"; rm -rf --one-file-system "$d"
  done
}

