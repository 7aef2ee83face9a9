"""Decisions the roles take from what a converge run found: which pairs restart and why, the
firewall's sources, whether a unit runs old code, which ports clash; and the few values the
roles derive from their settings or read back (the roll's groups, `pdctl roll`'s result, a
wait's tries, the PKI folder).

The roles pass their registered results in through filter_plugins/pdstack.py; the logic is
Python here rather than Jinja in vars files, so it has unit tests and types. Plain data in and
out: Ansible hands in its own dicts and lists, and stores only plain types in variables.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# A registered loop result: {"results": [{"changed": bool, "item": ..., ...}, ...]}; the list
# is what the roles pass.
Results = Sequence[Mapping[str, Any]]


def _changed(results: Results) -> list[Mapping[str, Any]]:
    return [r["item"] for r in results if r.get("changed")]


def changed_targets(targets: Results) -> list[str]:
    """The pair targets whose files a loop over the host's pairs changed."""
    return [item["target"] for item in _changed(targets)]


def changed_files(
    envs: Results, units: Results, targets: Results, unit_dir: str
) -> list[tuple[str, str]]:
    """(pair target, file) for every env file, engine unit and pair target changed: env files,
    then units, then targets, each in the order the tasks wrote them."""
    return (
        [(i["inst"]["pair_target"], i["env_file"]) for i in _changed(envs)]
        + [(i["inst"]["pair_target"], f"{unit_dir}/{i['inst']['unit']}") for i in _changed(units)]
        + [(t, f"{unit_dir}/{t}") for t in changed_targets(targets)]
    )


def changed_pairs(
    pairs: Iterable[Mapping[str, Any]],
    *,
    host: str,
    layout: Mapping[str, Any],
    envs: Results,
    units: Results,
    targets: Results,
    venv_changed: bool,
    pending: Sequence[str],
    restart: bool,
) -> list[dict[str, Any]]:
    """The host's pairs to restart, in host order: {pair, target, id (HOST/PAIR, or a group
    across hosts' name), reasons}.

    A pair changes when one of its files changed, when the venv changed (new packages change
    every pair), or, with `restart`, when an earlier run left its "restart pending" marker
    (`pending`: the marker paths found): its files no longer change, so nothing else would
    restart it. Without `restart` a marker is old news, not a reason.
    """
    files = changed_files(envs, units, targets, layout["unit_dir"])
    out = []
    for p in pairs:
        marker = f"{layout['restart_pending_dir']}/{p['pair']}.json"
        reasons = [f for target, f in files if target == p["target"]]
        if venv_changed:
            reasons.append(f"the engine venv ({layout['venv']})")
        if restart and marker in pending:
            reasons.append(f"restart pending ({marker})")
        if reasons:
            out.append(
                {
                    "pair": p["pair"],
                    "target": p["target"],
                    # A group across hosts gives its fleet-wide id (its name).
                    "id": p.get("id", f"{host}/{p['pair']}"),
                    "reasons": reasons,
                }
            )
    return out


def restart_plan(changed: Iterable[Mapping[str, Any]], restart: bool) -> list[str]:
    """What --check (and a real run) prints: a line per changed pair and why."""
    verb = "restart" if restart else "restart pending"
    return [f"{verb} {c['id']}: {', '.join(c['reasons'])}" for c in changed]


def running_pairs(
    changed: Sequence[Mapping[str, Any]], active: Sequence[str]
) -> list[Mapping[str, Any]]:
    """The changed pairs that run: `active` is `systemctl is-active` over their targets, a line
    each in the same order. The others are only started (run.yml)."""
    return [c for c, state in zip(changed, active, strict=False) if state == "active"]


# IPv4 addresses and networks are digits, dots and slashes; IPv6 ones hold a colon.
_IPV4 = re.compile(r"^[0-9./]+$")


def _is_address(source: str) -> bool:
    return bool(_IPV4.match(source)) or ":" in source


def firewall_given(
    hosts: Sequence[str], addresses: Sequence[str], allow: Sequence[str]
) -> list[str]:
    """The sources as the inventory gives them: each host's address (`addresses`, its
    ansible_host or ''), else its name, as pdctl resolves them; then `allow`. Once each."""
    given = [address or host for host, address in zip(hosts, addresses, strict=True)]
    return list(dict.fromkeys([*given, *allow]))


def firewall_names(given: Sequence[str]) -> list[str]:
    """The sources that are names, for the host to resolve (the rules hold addresses only)."""
    return [g for g in given if not _is_address(g)]


def firewall_sources(given: Sequence[str], resolved: Iterable[Sequence[str]]) -> list[str]:
    """The addresses the firewall lets through, sorted (the same inventory writes the same
    file): the given addresses, and those `getent ahosts` printed (`resolved`, its lines per
    name: the address first on each)."""
    names = set(firewall_names(given))
    found = [line.split()[0] for lines in resolved for line in lines if line.split()]
    return sorted({*(g for g in given if g not in names), *found})


def controller_address(ssh_client: str) -> list[str]:
    """The controller's address as the host sees it: the first word of the SSH connection's
    $SSH_CLIENT ("ADDRESS PORT PORT"); none without one (a local connection)."""
    return ssh_client.split()[:1]


def roll_groups(per_host: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """site.yml's one fleet roll: each host's running changed groups (running_pairs, hosts in
    inventory order), once each by id, with `hosts`: every host that listed it (a group with
    members on several hosts is listed by each of them, and restarts once)."""
    groups: dict[str, dict[str, Any]] = {}
    for host_groups in per_host:
        for g in host_groups:
            got = groups.setdefault(g["id"], {"id": g["id"], "hosts": []})
            if g["host"] not in got["hosts"]:
                got["hosts"].append(g["host"])
    return list(groups.values())


def roll_hosts(groups: Iterable[Mapping[str, Any]]) -> list[str]:
    """The hosts a roll of `groups` (roll_groups) touches, in order."""
    return list(dict.fromkeys(h for g in groups for h in g["hosts"]))


def roll_runs_on(groups: Iterable[Mapping[str, Any]]) -> str:
    """Where site.yml runs the roll: on the groups' host when they are all on one (no ssh, the
    engines on loopback), else on the controller ("localhost"), the one place that reaches
    every host (ssh as root, as Ansible does) and the store."""
    hosts = roll_hosts(groups)
    return hosts[0] if len(hosts) == 1 else "localhost"


def roll_result(stdout: str, rc: int) -> dict[str, Any]:
    """`pdctl roll`'s result (pdctl.ops.site_roll.Result, JSON on its stdout); one that says
    why there is none when pdctl ended without writing it (it failed to start, or a bug: its
    traceback is on its stderr)."""
    try:
        result = json.loads(stdout)
    except ValueError:
        result = None
    if isinstance(result, dict) and {"ok", "message", "groups"} <= result.keys():
        return result
    return {
        "ok": False,
        "exit": rc,
        "message": (
            f"pdctl roll ended (exit {rc}) without its result; its stderr says why "
            "(ansible-playbook -v shows it). pdctl status shows the groups."
        ),
        "groups": [],
    }


# ssh's own options that have a config-file keyword (`ssh -F`'s file is included).
_SSH_FLAGS = {"-i": "IdentityFile", "-p": "Port", "-J": "ProxyJump", "-l": "User"}


def _ssh_options(host: str, args: str) -> list[str]:
    """ssh command-line options (ansible_ssh_common_args, ..._extra_args) as config lines; a
    relative -F file is the one ssh would read from Ansible's folder."""
    words, out = shlex.split(args), []
    while words:
        word = words.pop(0)
        flag, value = word[:2], word[2:]
        if flag not in ("-F", "-o", *_SSH_FLAGS) or (not value and not words):
            raise ValueError(
                f"{host}: the ssh option {word!r} cannot be passed on to pdctl's ssh (the fleet "
                "roll from the controller): give it as -o Option=value, or in an ssh -F file"
            )
        value = value or words.pop(0)
        if flag == "-F":
            out.append(f"Include {os.path.abspath(value)}")
        elif flag == "-o":
            out.append(" ".join(value.replace("=", " ", 1).split(None, 1)))
        else:
            out.append(f"{_SSH_FLAGS[flag]} {value}")
    return out


def ssh_config(
    hosts: Sequence[Mapping[str, Any]],
    deployment: Mapping[str, Mapping[str, Any]],
    host_key_checking: bool,
) -> str:
    """An `ssh -F` file for pdctl on the controller ($PDCTL_SSH_CONFIG) that reaches each host
    at its pdctl address (the `deployment`'s hosts by name: {address}) the way Ansible does:
    `hosts` are each host's variables (inventory_hostname, and any of ansible_host,
    ansible_port, ansible_user, ansible_ssh_private_key_file, ansible_ssh_common_args,
    ansible_ssh_extra_args). ssh takes the first value of each option, so Ansible's own order
    of precedence holds: its variables, then its ssh arguments, then the -F file they name;
    then, with host_key_checking off (as Ansible runs), no host key check. pdctl logs in as
    root: another ansible_user is refused."""
    out = []
    for h in hosts:
        name = h["inventory_hostname"]
        address = deployment[name]["address"]
        user = h.get("ansible_user") or "root"
        if user != "root":
            raise ValueError(
                f"{name}: the roll of several hosts runs pdctl on the controller, which logs in "
                f"as root, but Ansible logs in as {user}: connect as root, or set "
                "pdstack_engine_restart_on_change=false and roll where root ssh works"
            )
        out.append(f"Host {address}")
        vars_ = {
            "HostName": h.get("ansible_host"),
            "Port": h.get("ansible_port"),
            "User": "root",
            "IdentityFile": h.get("ansible_ssh_private_key_file"),
        }
        out += [f"  {k} {v}" for k, v in vars_.items() if v]
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            out += [f"  {line}" for line in _ssh_options(name, h.get(key) or "")]
        if not host_key_checking:  # a block of its own: after an Include, first values win
            out += [f"Host {address}", "  StrictHostKeyChecking no"]
            out += ["  UserKnownHostsFile /dev/null"]
    return "\n".join(out) + "\n"


def ready_retries(timeout: int | str, each: Mapping[str, float]) -> int:
    """Tries of a readiness wait, each at most `each["timeout"]` s then `each["delay"]` s
    apart, so the whole wait stays within `timeout` s (a setting: it may come as a string)."""
    return math.ceil(int(timeout) / (each["timeout"] + each["delay"]))


def pki_dir(given: str, default: str, inventory_dir: str) -> str:
    """The controller's etcd PKI folder: `given` (pdstack_etcd_pki_dir) when set, relative to
    the inventory's folder unless absolute; else the deployment's default."""
    if not given:
        return default
    return given if posixpath.isabs(given) else f"{inventory_dir}/{given}"


def known_hosts(addresses: Sequence[str], keys: Sequence[str]) -> str:
    """known_hosts lines for pdstack's host-to-host ssh: each peer's address with its ed25519
    host key (its facts)."""
    return "".join(f"{a} ssh-ed25519 {k}\n" for a, k in zip(addresses, keys, strict=True))


def started_at(show_stdout: str) -> float:
    """`systemctl show -P ActiveEnterTimestamp --timestamp=unix` ("@SECONDS", or "" when the
    unit never started) as seconds; 0 when not running."""
    try:
        return float(show_stdout.strip().removeprefix("@"))
    except ValueError:
        return 0.0


def runs_old_code(show_stdout: str, mtimes: Iterable[float]) -> bool:
    """A unit started before its venv's packages last changed runs old code. Not running (no
    start time), or no venv yet (--check on a fresh host): nothing to restart."""
    since = started_at(show_stdout)
    return since > 0 and max(mtimes, default=0.0) > since


def registered_changed(register_stdout: str) -> bool:
    """Whether `pdctl gateway register --format json` added or removed a worker at any
    gateway (its output: a list of {gateway, workers: {url: what happened}})."""
    return any(
        state in ("added", "removed")
        for gateway in json.loads(register_stdout)
        for state in gateway["workers"].values()
    )


def listen_ports(dep: Mapping[str, Any], host: str) -> list[int]:
    """The TCP ports `host` will listen on, from the filter plugin's deployment: its engines',
    on a gateway host the gateway's, and on an [etcd] host the store member's client, peer and
    metrics ports."""
    gateway, etcd = dep["gateway"], dep["etcd"]
    ports = list(dep["hosts"].get(host, {}).get("ports", []))
    if host in gateway["urls"]:
        ports += [gateway["port"], gateway["metrics_port"]]
    if host in etcd["members"]:
        ports += [etcd["client_port"], etcd["peer_port"], etcd["metrics_port"]]
    return ports


def port_clashes(listeners: Iterable[str], ports: Iterable[int], unit_prefix: str) -> list[str]:
    """The `listeners` lines ("PORT UNIT PROCESS", roles/pdstack_preflight/tasks/ports.yml) on
    one of `ports` whose unit is not pdstack's: a port held by anything else makes an engine or
    the gateway fail at start, after the host was changed."""
    wanted = {str(p) for p in ports}
    clashes = []
    for line in listeners:
        port, unit, *_ = [*line.split(" ", 2), ""]
        if port in wanted and not unit.startswith(unit_prefix):
            clashes.append(line)
    return clashes


# The roles' names for these (filter_plugins/pdstack.py).
FILTERS = {
    "pdstack_changed_pairs": changed_pairs,
    "pdstack_changed_targets": changed_targets,
    "pdstack_restart_plan": restart_plan,
    "pdstack_running_pairs": running_pairs,
    "pdstack_firewall_given": firewall_given,
    "pdstack_firewall_names": firewall_names,
    "pdstack_firewall_sources": firewall_sources,
    "pdstack_runs_old_code": runs_old_code,
    "pdstack_registered_changed": registered_changed,
    "pdstack_listen_ports": listen_ports,
    "pdstack_port_clashes": port_clashes,
    "pdstack_controller_address": controller_address,
    "pdstack_roll_groups": roll_groups,
    "pdstack_roll_hosts": roll_hosts,
    "pdstack_roll_runs_on": roll_runs_on,
    "pdstack_roll_result": roll_result,
    "pdstack_ssh_config": ssh_config,
    "pdstack_ready_retries": ready_retries,
    "pdstack_pki_dir": pki_dir,
    "pdstack_known_hosts": known_hosts,
}
