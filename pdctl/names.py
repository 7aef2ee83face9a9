"""Every name and path pdstack gives things on a host: units, env files, directories.

The spec, the renderer, the topology file, the ops commands, the test harness and the Ansible
roles (through filter_plugins/pdstack.py) all take them from here, so a unit name is spelled
once and the roles need no regex to read one back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PREFIX = "pdstack"
ROLES = ("prefill", "decode")  # the values of pdctl.spec.Role, in pair order

INSTALL_DIR = f"/opt/{PREFIX}"
VENV = f"{INSTALL_DIR}/venv"
CONFIG_DIR = f"/etc/{PREFIX}"
STATE_DIR = f"/var/lib/{PREFIX}"
UNIT_DIR = "/etc/systemd/system"
SERVICE_USER = PREFIX
# pdctl by name on every host the roles install it on: a link to the venv's, on the default PATH.
PDCTL_LINK = "/usr/local/bin/pdctl"

TOPOLOGY_FILE = f"{CONFIG_DIR}/topology.yaml"
GATEWAY_UNIT = f"{PREFIX}-gateway.service"
GATEWAY_ENV_FILE = f"{CONFIG_DIR}/gateway.env"  # the gateway's secrets (root, 0600)
GATEWAY_BIN = f"{VENV}/bin/smg"
GATEWAY_KEY_VAR = "PDSTACK_GATEWAY_API_KEY"  # its name in GATEWAY_ENV_FILE
# Installed under INSTALL_DIR for the units' Documentation= (paths as in the checkout).
DOCS = ("README.md", "docs/runbook.md")
RECOVER_UNIT = f"{PREFIX}-recover@.service"
# Finishes restarts a dead restarter left half-way (pdctl finish), started by its timer.
FINISH_SERVICE = f"{PREFIX}-finish.service"
FINISH_TIMER = f"{PREFIX}-finish.timer"
# Root-only, apart from the engines' STATE_DIR: recovery refuses a folder others can write.
RECOVER_STATE = f"/var/lib/{PREFIX}-recover/recover-state.json"
RESTART_LOCK = f"/run/{PREFIX}/restart.lock"  # one restart at a time on this host
# The coordination store (etcd, docs/etcd.md): one member per
# [etcd] host, run by its own unit from Debian's etcd-server; TLS files the controller makes.
ETCD_UNIT = f"{PREFIX}-etcd.service"
ETCD_DATA_DIR = f"/var/lib/{PREFIX}-etcd"
ETCD_TLS_DIR = f"{CONFIG_DIR}/etcd"
ETCD_CA = f"{ETCD_TLS_DIR}/ca.crt"
ETCD_CLIENT_CERT = f"{ETCD_TLS_DIR}/client.crt"  # this host's client identity (root, 0600 key)
ETCD_CLIENT_KEY = f"{ETCD_TLS_DIR}/client.key"
# A member's own certificate, for its client and peer listeners (key: root, 0600; the unit
# hands it to the etcd user as a credential).
ETCD_MEMBER_CERT = f"{ETCD_TLS_DIR}/member.crt"
ETCD_MEMBER_KEY = f"{ETCD_TLS_DIR}/member.key"
# The deployment's cluster token, written beside a member's data once it is ours: preflight
# refuses a data directory of another cluster.
ETCD_CLUSTER_MARKER = f"{ETCD_DATA_DIR}/pdstack-cluster-token"
ETCD_SNAPSHOT_UNIT = f"{PREFIX}-etcd-snapshot.service"  # and its .timer
ETCD_SNAPSHOT_DIR = f"/var/backups/{PREFIX}-etcd"
ETCD_PREFIX = f"/{PREFIX}/"  # every key pdstack writes lives under it
# The gateway's liveness key in etcd, kept under a lease while the gateway unit runs.
GATEWAY_LEASE_UNIT = f"{PREFIX}-gateway-lease.service"
# The gateway's API key on every pd host (root, 0600): `pdctl restart` and `pdctl recover`
# authenticate with it to the gateways (drain, register).
OPS_ENV_FILE = f"{CONFIG_DIR}/ops.env"
# pdctl's own ssh from one GPU host to another (groups across hosts: a recovery unit reaches
# the group's other hosts; docs/security.md). Root's, outside /root: units have ProtectHome=.
PEER_SSH_DIR = f"{CONFIG_DIR}/ssh"
PEER_SSH_KEY = f"{PEER_SSH_DIR}/id_ed25519"
PEER_SSH_CONFIG = f"{PEER_SSH_DIR}/config"
PEER_SSH_KNOWN_HOSTS = f"{PEER_SSH_DIR}/known_hosts"
PEER_SSH_COMMENT = f"{PREFIX}-peer"  # marks its line in root's authorized_keys
# "Restart pending" markers: site.yml with pdstack_engine_restart_on_change=false writes one per
# changed pair, the coordinated restart removes it. Root's folder: restarts delete in it as root.
RESTART_PENDING_DIR = f"/var/lib/{PREFIX}-pending"

# Globs over UNIT_DIR that catch every engine unit and pair or group target, ours or a former
# one's (a group member's unit carries its number after the role).
PAIR_UNIT_GLOBS = (*(f"{PREFIX}-*-{r}*.service" for r in ROLES), f"{PREFIX}-*.target")
_PAIR_UNIT = re.compile(
    rf"^{PREFIX}-(?P<pair>.+?)"
    rf"(?:-(?P<role>{'|'.join(ROLES)})(?P<member>[0-9]*)\.service|\.target)$"
)


def documentation() -> str:
    """The value of a unit's Documentation=."""
    return " ".join(f"file://{INSTALL_DIR}/{doc}" for doc in DOCS)


def instance_name(pair: str, role: str, member: int | None = None) -> str:
    """`pd0-decode` for a pair's side (`member` None); `g0-prefill1` for a group's members,
    numbered from 0 per role in the profile's order."""
    return f"{pair}-{role}" if member is None else f"{pair}-{role}{member}"


def engine_unit(pair: str, role: str, member: int | None = None) -> str:
    return f"{PREFIX}-{instance_name(pair, role, member)}.service"


def pair_target(pair: str) -> str:
    """A pair's or a group's target: every member is PartOf= it."""
    return f"{PREFIX}-{pair}.target"


def recover_unit(pair: str) -> str:
    """The instance of RECOVER_UNIT an engine's OnFailure= starts."""
    return RECOVER_UNIT.replace("@", f"@{pair}")


def restart_pending(pair: str) -> str:
    """The marker file of a pair whose new files wait for a restart."""
    return f"{RESTART_PENDING_DIR}/{pair}.json"


def env_file(pair: str, role: str, member: int | None = None) -> str:
    return f"{CONFIG_DIR}/{instance_name(pair, role, member)}.env"


def pair_files(pair: str) -> list[str]:
    """Every file site.yml writes for one pair: its target, both units, both env files and
    its restart-pending marker."""
    units = [pair_target(pair), *(engine_unit(pair, r) for r in ROLES)]
    files = [f"{UNIT_DIR}/{u}" for u in units] + [env_file(pair, r) for r in ROLES]
    return [*files, restart_pending(pair)]


def pair_of_unit(unit: str) -> str | None:
    """The pair or group an engine unit or target belongs to; None for any other unit."""
    m = _PAIR_UNIT.match(unit)
    return m["pair"] if m else None


def stale_pairs(found_units: Iterable[str], keep: Iterable[str]) -> dict[str, list[str]]:
    """Pairs with units on a host that the deployment no longer places there.

    `found_units`: unit file names found under UNIT_DIR (PAIR_UNIT_GLOBS); `keep`: the host's
    pairs and groups. Returns the stale `pairs` (and groups), the units to `stop` (targets
    first: PartOf= stops their engines; then any engine still running) and the `files` to
    remove: a pair's every file, and a group member's unit and env file as found.
    """
    found = list(dict.fromkeys(found_units))
    kept = set(keep)
    ours = [(u, pair_of_unit(u)) for u in found]
    stale = [(u, p) for u, p in ours if p is not None and p not in kept]
    pairs = list(dict.fromkeys(p for _, p in stale))
    targets = [u for u, _ in stale if u.endswith(".target")]
    engines = [u for u, _ in stale if u.endswith(".service")]
    return {
        "pairs": pairs,
        "stop": targets + engines,
        "files": [f for p in pairs for f in pair_files(p)] + _member_files(engines),
    }


def _member_files(units: list[str]) -> list[str]:
    """The unit and env file of each group member among `units` (pair_files has a pair's)."""
    out = []
    for unit in units:
        m = _PAIR_UNIT.match(unit)
        if m and m["member"]:
            out += [f"{UNIT_DIR}/{unit}", env_file(m["pair"], m["role"], int(m["member"]))]
    return out
