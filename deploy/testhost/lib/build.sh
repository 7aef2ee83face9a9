# shellcheck shell=bash
# Sourced by deploy/testhost/testhost:
# the cached Debian root (build, and up's first step).

# -------------------------------------------------------------------------- the mirror
# The mirror debootstrap uses: PDSTACK_TESTHOST_MIRROR, else the first Debian archive URI this
# machine's apt uses for $SUITE (deb822 .sources or one-line sources.list), never hard-coded.
apt_mirror() {
  if [[ -n ${PDSTACK_TESTHOST_MIRROR:-} ]]; then echo "$PDSTACK_TESTHOST_MIRROR"; return; fi
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    uri=$(awk -v suite="$SUITE" '
      function flush() { if (uris != "" && suites ~ ("(^| )" suite "( |$)") && types ~ /(^| )deb( |$)/) { split(uris, u, " "); print u[1]; found = 1; exit } uris = ""; suites = ""; types = "" }
      /^[[:space:]]*$/ { flush(); next }
      /^[[:space:]]*#/ { next }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      tolower($1) == "uris:" { $1 = ""; uris = $0 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      END { if (!found) flush() }' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    uri=$(awk -v suite="$SUITE" '
      $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == suite) { print $i; exit } }' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  die "no apt source for '$SUITE' found in /etc/apt/sources.list*; set PDSTACK_TESTHOST_MIRROR=http://<debian mirror>/debian"
}

# ---------------------------------------------------------------------- the cached root
# Everything that shapes the pristine root goes into its cache key.
prepare_pristine() {  # $1 = rootfs; runs once per cache key, after debootstrap
  local r=$1
  # Host keys and machine id are made per 'up'; apt lists are useless without a mirror route.
  rm -f "$r"/etc/ssh/ssh_host_*
  : > "$r/etc/machine-id"
  rm -f "$r/var/lib/dbus/machine-id"
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb
  mkdir -p "$r/root/.ssh" "$r/etc/ssh/sshd_config.d" "$r/etc/systemd/system"
  chmod 700 "$r/root/.ssh"
  cat > "$r/etc/ssh/sshd_config.d/10-pdstack-testhost.conf" <<'EOF'
# pdstack test host: root by key only.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
  # Nothing in a test host should phone home or wait for a terminal.
  local u
  for u in apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
           e2scrub_all.timer e2scrub_reap.service fstrim.timer \
           console-getty.service getty@.service systemd-timesyncd.service; do
    ln -sfn /dev/null "$r/etc/systemd/system/$u"
  done
  # Debian's own etcd.service (an unsecured member on 127.0.0.1:2379) stays off, as on a host
  # where pdstack_etcd installed the package: its member runs as pdstack-etcd.service instead.
  rm -f "$r/etc/systemd/system/multi-user.target.wants/etcd.service"
  ln -sfn /dev/null "$r/etc/systemd/system/etcd.service"
  printf 'LANG=C.UTF-8\n' > "$r/etc/default/locale"
}

cache_key() {
  { printf '%s\n' "$SUITE" "$VARIANT" "$(uname -m)" "${PACKAGES[@]}" "${EXTRA_PACKAGES[@]}"
    declare -f prepare_pristine; } |
    sha256sum | cut -c1-12
}

pristine_dir() { echo "$CACHE_DIR/$SUITE-$(cache_key)"; }

build_pristine() {
  local dir; dir=$(pristine_dir)
  if [[ -e $dir/.complete ]]; then
    log "cached root: $dir"
    return
  fi
  mkdir -p "$CACHE_DIR"
  # One lock per root: builds of different package lists run at once (scripts/setup.sh).
  local lock; lock="$CACHE_DIR/.build-${dir##*/}.lock"
  exec 8>"$lock"
  if ! flock -n 8; then
    log "another build of this root is running; waiting (up to ${BUILD_TIMEOUT}s)"
    flock -w "$BUILD_TIMEOUT" 8 || die "timed out waiting for the lock $lock"
  fi
  if [[ -e $dir/.complete ]]; then exec 8>&-; log "cached root: $dir"; return; fi
  need_tools debootstrap
  local mirror tmp t0 rc=0
  mirror=$(apt_mirror)
  tmp="$dir.tmp.$$"
  rm -rf --one-file-system "$dir" "$dir".tmp.*
  mkdir -p "$tmp"
  log "building the $SUITE root (debootstrap --variant=$VARIANT from $mirror; once per package list, ~1-3 min)"
  log "packages: ${PACKAGES[*]}${EXTRA_PACKAGES[*]:+ ${EXTRA_PACKAGES[*]}}"
  t0=$(now)
  # Progress: debootstrap prints a line per phase; keep them (prefixed) unless quiet.
  timeout "$BUILD_TIMEOUT" debootstrap --variant="$VARIANT" \
      --include="$(IFS=,; echo "${PACKAGES[*]} ${EXTRA_PACKAGES[*]}" | tr ' ' ',' | sed 's/,*$//')" \
      "$SUITE" "$tmp/rootfs" "$mirror" \
      > "$tmp/debootstrap.log" 2>&1 &
  local pid=$! last=""
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    local line; line=$(grep -E '^I: (Retrieving|Validating|Extracting|Installing|Unpacking|Configuring)' "$tmp/debootstrap.log" | tail -1 || true)
    if [[ -n $line && $line != "$last" ]]; then log "  [$(( $(now) - t0 ))s] ${line#I: }"; last=$line; fi
  done
  wait "$pid" || rc=$?
  if ((rc)); then
    tail -n 20 "$tmp/debootstrap.log" >&2 || true
    [[ -f $tmp/rootfs/debootstrap/debootstrap.log ]] && tail -n 20 "$tmp/rootfs/debootstrap/debootstrap.log" >&2
    ((rc == 124)) && die "debootstrap timed out after ${BUILD_TIMEOUT}s (log: $tmp/debootstrap.log)"
    die "debootstrap failed (exit $rc; log: $tmp/debootstrap.log). Check the mirror ($mirror) is reachable, or set PDSTACK_TESTHOST_MIRROR"
  fi
  prepare_pristine "$tmp/rootfs"
  printf 'suite=%s\nvariant=%s\nmirror=%s\npackages=%s\nbuilt=%s\nseconds=%s\n' \
    "$SUITE" "$VARIANT" "$mirror" "${PACKAGES[*]} ${EXTRA_PACKAGES[*]}" "$(date -u +%FT%TZ)" "$(( $(now) - t0 ))" > "$tmp/info"
  touch "$tmp/.complete"
  mv "$tmp" "$dir"
  exec 8>&-
  log "built $dir in $(( $(now) - t0 ))s ($(du -sh "$dir/rootfs" | cut -f1))"
}

