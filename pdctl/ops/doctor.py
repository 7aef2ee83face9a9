"""`pdctl validate` plus what only the running deployment shows.

Live checks: a pair whose canary fails while both sides answer /ready (the degraded pair
of the seed's incident), an engine left paused by /pause_generation, members the gateway
holds under another group's pairing protocol or none, decode batches running eager, KV
usage that stays up while idle, running flags that differ from the rendered ones (drift),
units failed or restarting, the fleet restart lock unreachable or held by a dead holder,
coordination store members down.
"""

from __future__ import annotations

from functools import partial

from pdctl import names, render
from pdctl.analyze.logparse import DecodeBatch, parse_line
from pdctl.coord import health
from pdctl.coord.history import History
from pdctl.coord.store import StoreUnavailable
from pdctl.errors import PdctlError
from pdctl.lint import Finding, Severity, lint
from pdctl.ops.context import Ops
from pdctl.ops.health import concurrently
from pdctl.ops.status import InstanceStatus, Status, collect
from pdctl.pdclient import CANARIES_DOCTOR
from pdctl.spec import Role

IDLE_KV_USAGE = 0.05  # KV share still held with nothing running or queued
JOURNAL_LINES = 400


def _error(id: str, where: str, message: str, fix: str) -> Finding:
    return Finding(id, Severity.ERROR, where, message, fix)


def _warning(id: str, where: str, message: str, fix: str) -> Finding:
    return Finding(id, Severity.WARNING, where, message, fix)


def unit_findings(s: Status) -> list[Finding]:
    out: list[Finding] = []
    for i in s.instances:
        u, where = i.unit, i.instance.id
        if u is None:
            out.append(
                _error(
                    "live-host",
                    where,
                    f"cannot read the unit: {i.unit_error}",
                    "check that the host is up and reachable over ssh",
                )
            )
        elif u.active != "active":
            out.append(
                _error(
                    "live-unit",
                    where,
                    f"{u.unit} is {u.active} ({u.sub})",
                    f"pdctl restart --both --pair {i.pair_id}",
                )
            )
        elif u.restarts:
            out.append(
                _warning(
                    "live-restarts",
                    where,
                    f"{u.unit} restarted {u.restarts} times since it was loaded",
                    "read its journal for the cause",
                )
            )
    return out


def paused_findings(s: Status) -> list[Finding]:
    """Engines whose generation is paused (/pause_generation, for a weight update or by
    hand): SGLang holds every new request until /continue_generation, so the pair's canary
    and the gateway's requests to it wait. Nothing ends a pause but that call or a restart."""
    fix = "curl -X POST {}/continue_generation -H 'Content-Type: application/json' -d '{{}}'"
    return [
        _error(
            "live-paused",
            i.instance.id,
            "generation is paused (/ready 503, /ping 200): it holds every new request until "
            "/continue_generation",
            fix.format(i.instance.url),
        )
        for i in s.instances
        if i.probe.paused
    ]


def pair_findings(s: Status) -> list[Finding]:
    out: list[Finding] = []
    by_pair: dict[str, list[InstanceStatus]] = {}
    for i in s.instances:
        by_pair.setdefault(i.pair_id, []).append(i)
    for p in s.pairs:
        sides = by_pair.get(p.id, [])
        if p.canary.ok or any(i.probe.paused for i in sides):
            continue  # a paused side holds the canary: live-paused says so and what ends it
        down = [i.instance.name for i in sides if not i.probe.healthy]
        if down:
            out.append(
                _error(
                    "live-pair-down",
                    p.id,
                    f"group canary fails and {', '.join(down)} "
                    f"does not answer /ready: {p.canary.error}",
                    f"pdctl restart --both --pair {p.id}",
                )
            )
        else:
            out.append(
                _error(
                    "live-degraded-pair",
                    p.id,
                    f"degraded group: {p.canary.failed}/{p.canary.sent} canary requests failed "
                    f"while both sides answer /ready ({p.canary.error}); typical after one side "
                    "restarted alone",
                    f"run pdctl restart --both --pair {p.id}",
                )
            )
    out += [
        _error("live-gateway", g.url, f"gateway not ready: {g.detail}", "pdctl restart --gateways")
        for g in s.gateways
        if not g.ready
    ]
    return out + binding_findings(s)


def binding_findings(s: Status) -> list[Finding]:
    """At every gateway that listed its workers: healthy members it does not hold, and members
    it holds under a pairing protocol that is not their group's id. It pairs a prefill only
    with decodes of the same protocol, so such a member serves another group (KV across
    groups) or, unbound, any; and a group whose members hold different protocols cannot pair
    within itself. One group bound alike has nothing to mix with."""
    groups = {p.id for p in s.pairs}
    out: list[Finding] = []
    for gateway, by_url in s.views.items():
        protocols: dict[str, set[str | None]] = {}
        for i in s.instances:
            if (w := by_url.get(i.instance.url)) is not None:
                protocols.setdefault(_group_of(i), set()).add(w.pairing)
        for i in s.instances:
            group, w = _group_of(i), by_url.get(i.instance.url)
            fix = f"pdctl restart --both --pair {group}"  # drains it, registers it bound
            if w is None:
                if i.probe.healthy:
                    out.append(
                        _warning(
                            "live-unregistered",
                            i.instance.id,
                            f"healthy but not registered with the gateway at {gateway} (no "
                            "traffic from it)",
                            fix,
                        )
                    )
                continue
            if w.pairing == group or (len(groups) == 1 and len(protocols[group]) == 1):
                continue
            kind = i.instance.role.value
            if w.pairing in groups:
                out.append(
                    _warning(
                        "live-misbound",
                        i.instance.id,
                        f"{kind} of {group} is registered at {gateway} under {w.pairing}'s "
                        f"pairing protocol ({w.pairing}), not its own group's: the gateway "
                        f"pairs it with {w.pairing}'s workers (KV across groups) and never "
                        f"with {group}'s",
                        fix,
                    )
                )
            else:
                out.append(
                    _warning(
                        "live-unbound",
                        i.instance.id,
                        f"{kind} of {group} is registered at {gateway} with pairing protocol "
                        f"{w.pairing or '(none)'}, not {group}: the gateway may combine it with "
                        "another group's worker (KV across groups, stale state after "
                        "restarts); workers listed on the gateway's command line are unbound",
                        fix,
                    )
                )
    return out


def _group_of(i: InstanceStatus) -> str:
    return i.pair_id


def kv_findings(s: Status) -> list[Finding]:
    return [
        _warning(
            "live-kv-idle",
            i.instance.id,
            f"KV usage {i.probe.token_usage:.0%} with no running or queued request: KV "
            "held by orphaned requests (prefill keeps it until the bootstrap timeout)",
            "check the journal for transfer failures; restart its group if it stays up",
        )
        for i in s.instances
        if i.probe.running == 0
        and i.probe.queued == 0
        and (i.probe.token_usage or 0) > IDLE_KV_USAGE
    ]


def eager_findings(ops: Ops, s: Status) -> list[Finding]:
    decodes = [i for i in s.instances if i.instance.role is Role.DECODE]
    journals = concurrently({i.instance.id: partial(_journal, ops, i) for i in decodes})
    out: list[Finding] = []
    for i in decodes:
        batches = [
            b for b in map(parse_line, journals[i.instance.id]) if isinstance(b, DecodeBatch)
        ]
        eager = [b for b in batches if b.cuda_graph is False]
        if eager or i.probe.cuda_graph is False:
            top = max((b.running for b in eager), default=0)
            out.append(
                _warning(
                    "live-eager",
                    i.instance.id,
                    f"{len(eager)}/{len(batches)} recent decode batches ran eager (up to {top} "
                    "running): slow, and eager temporaries can OOM",
                    "raise engine.decode.cuda_graph_max_bs to the batch sizes you see (pdctl plan)",
                )
            )
    return out


def _journal(ops: Ops, i: InstanceStatus) -> list[str]:
    try:
        return ops.systemd(i.instance.host).journal(i.instance.unit, JOURNAL_LINES)
    except PdctlError:
        return []


def _flags(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """Launch flags after `-m MODULE` as flag -> values."""
    if "-m" in argv:
        argv = argv[argv.index("-m") + 2 :]
    out: dict[str, tuple[str, ...]] = {}
    flag = None
    for tok in argv:
        if tok.startswith("--"):
            flag = tok
            out[flag] = ()
        elif flag is not None:
            out[flag] = (*out[flag], tok)
    return out


def drift_findings(ops: Ops, s: Status) -> list[Finding]:
    """Running argv against the rendered launch line (with -i/-p), else the unit's ExecStart
    (an edited unit whose process was not restarted)."""
    dep = ops.source.deployment
    rendered = {i.id: render.launch_args(i, dep) for i in dep.instances} if dep else {}
    out: list[Finding] = []
    for i in s.instances:
        if i.unit is None or not i.unit.main_pid:
            continue
        running = ops.systemd(i.instance.host).cmdline(i.unit.main_pid)
        expected = rendered.get(i.instance.id)
        source = "the rendered launch line" if expected is not None else "its unit's ExecStart"
        want = _flags(["-m", "x", *expected] if expected is not None else i.unit.exec_start)
        have = _flags(running)
        if not running or not want:
            continue
        diffs = sorted(f for f in want.keys() | have.keys() if want.get(f) != have.get(f))
        if diffs:
            shown = "; ".join(
                f"{f}: running {' '.join(have.get(f, ('(absent)',)))}, expected "
                f"{' '.join(want.get(f, ('(absent)',)))}"
                for f in diffs[:5]
            )
            out.append(
                _warning(
                    "live-drift",
                    i.instance.id,
                    f"PID {i.unit.main_pid} runs with flags differing from {source}: {shown}",
                    "run site.yml (restarts changed groups whole)",
                )
            )
    return out


def lock_findings(ops: Ops, s: Status) -> list[Finding]:
    """The fleet restart lock: etcd cannot serve it (no restart can start), or its last
    holder lost it mid-restart (the history's record still says "running")."""
    if ops.fleet_lock is None:
        return []
    where = ops.fleet_lock.store.describe()
    if s.lock_error:
        return [
            _error(
                "live-fleet-lock",
                where,
                f"{s.lock_error}: pdctl restart refuses to run (exit 5) and recoveries wait",
                "bring the etcd members back (pdctl doctor's live-etcd findings name them)",
            )
        ]
    abandoned = [
        _error("live-abandoned-restart", p.id, p.abandoned, "pdctl finish")
        for p in s.pairs
        if p.abandoned
    ]
    if s.lock is not None or abandoned:
        return abandoned
    try:
        last = History(ops.fleet_lock.store).records(limit=1)
    except StoreUnavailable:
        return []
    if last and last[0].result == "running":
        r = last[0]
        return [
            _warning(
                "live-fleet-lock-lost",
                r.host,
                f"{r.host} PID {r.pid} {r.command} lost the fleet restart lock before it "
                "finished (its lease expired: killed, paused or cut off)",
                "pdctl status for groups it left drained; pdctl restart --both puts them back",
            )
        ]
    return []


def store_findings(ops: Ops) -> list[Finding]:
    """The coordination store: each member that is down or unhealthy, by its endpoint; an
    error when the healthy ones are no majority (no lock can be taken), else a warning."""
    coord = ops.source.topology.coord
    if coord is None:
        return []
    members = health.member_health(coord)
    bad = [m for m in members if not m.healthy]
    up = f"{len(members) - len(bad)} of {len(members)} members healthy"
    fix = f"systemctl status {names.ETCD_UNIT} on that host; docs/runbook.md#pdetcdmemberdown"
    if not health.quorum(members):
        return [
            _error(
                "live-etcd",
                m.endpoint,
                f"etcd member {m.detail}; only {up}, no quorum: pdctl restart and pdctl "
                "recover cannot take the lock",
                fix,
            )
            for m in bad
        ]
    return [
        _warning(
            "live-etcd-member", m.endpoint, f"etcd member {m.detail}; {up}: the store runs on", fix
        )
        for m in bad
    ]


def doctor(ops: Ops, canary_count: int = CANARIES_DOCTOR) -> tuple[list[Finding], Status]:
    dep = ops.source.deployment
    findings = lint(dep) if dep else []
    s = collect(ops, canary_count)
    findings += unit_findings(s) + paused_findings(s) + pair_findings(s) + kv_findings(s)
    findings += eager_findings(ops, s) + drift_findings(ops, s) + lock_findings(ops, s)
    findings += store_findings(ops)
    return findings, s
