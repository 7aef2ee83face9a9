# shellcheck shell=bash disable=SC2034  # NUMA_TREE: read by the other files of testhost
# Sourced by deploy/testhost/testhost:
# preflight checks, runtime state, ssh, bridges, pretend NUMA nodes (every command).

# ---------------------------------------------------------------------------- preflight
need_root() {
  [[ $(id -u) == 0 ]] || die "must run as root (debootstrap, systemd-nspawn and veth links need it)"
}

need_tools() {
  local -A pkg=([debootstrap]=debootstrap [systemd-nspawn]=systemd-container [ip]=iproute2
                [ssh]=openssh-client [ssh-keygen]=openssh-client [nsenter]=util-linux
                [setsid]=util-linux [flock]=util-linux [timeout]=coreutils [sha256sum]=coreutils)
  local missing=() pkgs=() t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || { missing+=("$t"); pkgs+=("${pkg[$t]:-$t}"); }
  done
  if ((${#missing[@]})); then
    die "missing tools: ${missing[*]}; install them with: apt-get install -y $(printf '%s\n' "${pkgs[@]}" | sort -u | tr '\n' ' ')(or run scripts/setup.sh)"
  fi
}

check_name() {
  [[ $NAME =~ ^[a-z][a-z0-9-]{0,11}$ ]] ||
    die "bad --name '$NAME': use 1-12 characters [a-z0-9-] starting with a letter (the host-side link is ve-NAME or vb-NAME, at most 15 characters)"
}

# A fleet's state directory is not a host's: up and down of a single host leave it alone.
not_a_fleet() {
  [[ ! -f $STATE_DIR/$NAME/hosts ]] ||
    die "'$NAME' is a fleet, not a host: use '$PROG fleet-down --fleet $NAME' or another --name"
}

check_bridge() {
  [[ -z $BRIDGE || $BRIDGE =~ ^[a-z][a-z0-9-]{0,14}$ ]] ||
    die "bad --bridge '$BRIDGE': use 1-15 characters [a-z0-9-] starting with a letter (a link name)"
  [[ $NUMA_NODES =~ ^[1-8]$ ]] || die "bad --numa-nodes '$NUMA_NODES': use 1-8"
}

check_fleet() {
  [[ $FLEET =~ ^[a-z][a-z0-9-]{0,9}$ ]] ||
    die "bad --fleet '${FLEET}': use 1-10 characters [a-z0-9-] starting with a letter (hosts are FLEET1, FLEET2, ...)"
  [[ $FLEET_SIZE =~ ^[1-9]$ ]] || die "bad --size '$FLEET_SIZE': use 1-9"
}


# -------------------------------------------------------------------------- runtime state
rundir() { echo "$RUN_DIR/$NAME"; }
statedir() { echo "$STATE_DIR/$NAME"; }
rootfs() { echo "$LIB_DIR/$NAME/rootfs"; }

# shellcheck disable=SC2015  # a missing or unreadable state file reads as empty
read_state() { local f; f="$(rundir)/$1"; [[ -f $f ]] && cat "$f" || true; }

proc_starttime() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null || true; }

# A recorded PID is ours only if it is alive and has the start time we recorded (no PID reuse).
pid_is_ours() {  # $1 = state file prefix (nspawn|leader)
  local pid st; pid=$(read_state "$1.pid"); st=$(read_state "$1.start")
  [[ -n $pid && -d /proc/$pid && -n $st && $(proc_starttime "$pid") == "$st" ]] || return 1
  # A zombie (exited, not yet reaped by PID 1 of this machine) is not running.
  [[ $(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

host_running() { pid_is_ours nspawn && pid_is_ours leader; }

# The controller side of the host's link: its own veth, or its port on a bridge.
host_link() {
  local br; br=$(read_state bridge)
  if [[ -n ${br:-$BRIDGE} ]]; then echo "vb-$NAME"; else echo "ve-$NAME"; fi
}

ssh_opts() {
  local s; s=$(statedir)
  printf '%s\n' -i "$s/id_ed25519" -o IdentitiesOnly=yes -o BatchMode=yes \
    -o UserKnownHostsFile="$s/known_hosts" -o StrictHostKeyChecking=yes \
    -o ConnectTimeout=3 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
    -o LogLevel=ERROR -o ControlMaster=no -o ControlPath=none
}

ssh_argv() {  # sets SSH=(ssh ... root@ADDRESS)
  local addr opts; addr=$(read_state address)
  [[ -n $addr ]] || die "test host '$NAME' has no recorded address (is it up? try: $PROG status --name $NAME)"
  mapfile -t opts < <(ssh_opts)
  SSH=(ssh "${opts[@]}" "root@$addr")
}

run_ssh() {  # run_ssh [ssh args...] [--] [command...]
  local SSH; ssh_argv
  "${SSH[@]}" "$@"
}

# First free /30 in 10.213.0.0/16 (not recorded for another host, not on any local link).
allocate_slot() {
  local used k a b
  used=$(cat "$RUN_DIR"/*/slot 2>/dev/null || true)
  local addrs; addrs=$(ip -4 -o addr show 2>/dev/null | awk '{ print $4 }' | cut -d/ -f1)
  for ((k = 0; k < 16384; k++)); do
    grep -qx "$k" <<<"$used" && continue
    a=$((k / 64)); b=$(((k % 64) * 4))
    grep -qE "^$NET_PREFIX\.$a\.($((b+1))|$((b+2)))$" <<<"$addrs" && continue
    echo "$k"; return
  done
  die "no free /30 left in $NET_PREFIX.0.0/16"
}

# ------------------------------------------------------------------------------ bridges
bridge_dir() { echo "$RUN_DIR/.bridges/$1"; }

# Hosts recorded on bridge $1 (other than $NAME when $2 = others).
bridge_members() {
  local f
  for f in "$RUN_DIR"/*/bridge; do
    [[ -f $f && $(cat "$f") == "$1" ]] || continue
    f=${f%/bridge}; f=${f##*/}
    [[ ${2:-} == others && $f == "$NAME" ]] && continue
    echo "$f"
  done
}

# Create bridge $BRIDGE with its own /24 if it is not there (under the run lock); sets K.
ensure_bridge() {
  local bd used addrs; bd=$(bridge_dir "$BRIDGE")
  if [[ -f $bd/subnet ]] && ip link show "$BRIDGE" >/dev/null 2>&1; then K=$(cat "$bd/subnet"); return; fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "link $BRIDGE already exists but was not made by $PROG; use another --bridge or remove it: ip link del $BRIDGE"
  fi
  used=$(cat "$RUN_DIR"/.bridges/*/subnet 2>/dev/null || true)
  addrs=$(ip -4 -o addr show 2>/dev/null | awk '{ print $4 }' | cut -d/ -f1)
  for ((K = 0; K < 256; K++)); do
    grep -qx "$K" <<<"$used" && continue
    grep -qE "^$BRIDGE_PREFIX\.$K\." <<<"$addrs" && continue
    break
  done
  ((K < 256)) || die "no free /24 left in $BRIDGE_PREFIX.0.0/16"
  ip link add "$BRIDGE" type bridge
  mkdir -p "$bd"; echo "$K" > "$bd/subnet"
  ip addr add "$BRIDGE_PREFIX.$K.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  log "bridge $BRIDGE: $BRIDGE_PREFIX.$K.1/24 (controller side)"
}

# Remove bridge $1 when no recorded host is on it any more (under the run lock).
release_bridge() {
  local br=$1
  [[ -n $br && -z $(bridge_members "$br" others) ]] || return 0
  if ip link show "$br" >/dev/null 2>&1; then
    ip link del "$br" && log "removed bridge $br"
  fi
  rm -rf "$(bridge_dir "$br")"
}

# First free guest address .2-.254 on the bridge's /24 $BRIDGE_PREFIX.$1.0.
allocate_bridge_address() {
  local used i; used=$(for i in $(bridge_members "$BRIDGE" others); do cat "$RUN_DIR/$i/address" 2>/dev/null; done)
  for ((i = 2; i < 255; i++)); do
    grep -qx "$BRIDGE_PREFIX.$1.$i" <<<"$used" || { echo "$BRIDGE_PREFIX.$1.$i"; return; }
  done
  die "bridge $BRIDGE is full (253 hosts)"
}

# ---------------------------------------------------------------------- pretend NUMA nodes
# The kernel has the controller's nodes (here one); a host with --numa-nodes N sees N nodes in
# /sys/devices/system/node (a bind of a tree in its root, mounted once it runs: nspawn mounts
# sysfs over its own binds) and a numactl that binds a pretend node's CPUs (taskset) and leaves
# the memory policy alone.
NUMA_TREE=/etc/pdstack-testhost/numa  # in the host's root
write_numa_tree() {  # $1 = directory
  local dir=$1 cpus n i j per list f
  mapfile -t cpus < <(awk -F, '{ for (i = 1; i <= NF; i++) { n = split($i, r, "-"); for (c = r[1]; c <= r[n]; c++) print c } }' /sys/devices/system/cpu/online)
  n=${#cpus[@]}
  rm -rf "$dir"; mkdir -p "$dir"
  for f in online possible has_cpu has_memory has_normal_memory; do
    echo "0-$((NUMA_NODES - 1))" > "$dir/$f"
  done
  per=$(( n >= NUMA_NODES ? n / NUMA_NODES : 1 ))
  for ((i = 0; i < NUMA_NODES; i++)); do
    mkdir -p "$dir/node$i"
    list=()
    if ((n >= NUMA_NODES)); then
      for ((j = i * per; j < (i == NUMA_NODES - 1 ? n : (i + 1) * per); j++)); do list+=("${cpus[j]}"); done
    else
      list=("${cpus[i % n]}")
    fi
    (IFS=,; echo "${list[*]}") > "$dir/node$i/cpulist"
  done
}

install_numactl_shim() {  # $1 = rootfs
  local r=$1
  chroot "$r" dpkg-divert --quiet --local --rename --divert /usr/bin/numactl.real --add /usr/bin/numactl
  cat > "$r/usr/bin/numactl" <<'EOF'
#!/bin/sh
# pdstack test host with pretend NUMA nodes (testhost up --numa-nodes): the kernel knows fewer
# nodes, so `numactl --cpunodebind=N --membind=N CMD` runs CMD on node N's CPUs (from
# /sys/devices/system/node/nodeN/cpulist) without a memory policy. Anything else: the real one.
case $1 in
  --cpunodebind=*)
    node=${1#*=}
    case $2 in --membind=*) shift ;; esac
    shift
    cpus=$(cat "/sys/devices/system/node/node$node/cpulist") || exit 1
    exec taskset -c "$cpus" "$@" ;;
esac
exec /usr/bin/numactl.real "$@"
EOF
  chmod 755 "$r/usr/bin/numactl"
}

find_leader() {  # $1 = nspawn pid -> the container's PID 1 as seen from here
  local np=$1 c
  # shellcheck disable=SC2013  # the file holds PIDs separated by spaces
  for c in $(cat /proc/"$np"/task/*/children 2>/dev/null); do
    if [[ $(readlink "/proc/$c/ns/pid" 2>/dev/null) != "$(readlink "/proc/$np/ns/pid")" ]]; then
      echo "$c"; return 0
    fi
  done
  return 1
}

console_tail() {
  local f; f="$(rundir)/console.log"
  [[ -s $f ]] && { echo "--- last lines of $f ---" >&2; tail -n 25 "$f" >&2; }
  return 0
}

