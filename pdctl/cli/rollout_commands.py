"""`pdctl rollout start | status | pause | resume | undo` (pdctl.ops.rollout)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from pydantic import ValidationError

from pdctl.cli.options import format_option, load_source, source_options
from pdctl.coord.kv import StoreUnavailable
from pdctl.errors import PdctlError
from pdctl.ops import gate
from pdctl.ops import rollout as ro
from pdctl.ops.context import NO_STORE, Ops, real_ops, store_of
from pdctl.ops.release import Release, describe
from pdctl.ops.rollout_state import Record, Records, controller
from pdctl.spec.profile import Rollout

lock_wait_option = click.option(
    "--lock-wait",
    type=float,
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long each wave waits for the restart lock (a recovery may hold it).",
)
prometheus_option = click.option(
    "--prometheus",
    "prometheus",
    envvar="PDCTL_PROMETHEUS_URL",
    metavar="URL",
    help="Prometheus the gate reads (http://HOST:9090; $PDCTL_PROMETHEUS_URL).",
)


def _ops(topology_path: Path, inventory: Path, profile: Path | None) -> Ops:
    return real_ops(load_source(topology_path, inventory, profile))


def _settings(ops: Ops, lock_wait: float) -> ro.Settings:
    if ops.fleet_lock is None:
        raise StoreUnavailable(f"{NO_STORE}: a rollout keeps its record in etcd")
    return ro.Settings(ttl_s=ops.fleet_lock.ttl_s, lock_wait=lock_wait)


def _query_for(given: str | None) -> ro.QueryFor:
    """The gate's query: --prometheus when given, else the URL the record names."""

    def query_for(recorded: str | None) -> gate.Query:
        url = given or recorded
        if url is None:
            raise PdctlError("the gate reads Prometheus: give --prometheus URL")
        return gate.prometheus(url)

    return query_for


def _ended(rec: Record) -> None:
    click.echo(f"rollout {rec.id}: {rec.state}" + (f" ({rec.message})" if rec.message else ""))


@click.group()
def rollout() -> None:
    """Move groups to a new release (environment, model revision) in gated waves.

    Each wave of --max-unavailable groups switches its release drop-ins, restarts through
    the coordinated restart, serves for rollout.soak_s, and is compared with the groups still
    on the old release (Prometheus: failed requests, TTFT and ITL p90, KV transfer failures).
    A failed gate rolls the wave back and stops. The rollout's record is in etcd: status,
    pause, resume and undo work from any machine (docs/rollout.md).

    \b
    Exit codes: 0 done (or paused); 2 refused, nothing changed (a rollout is live already,
    nothing to pause, resume or undo, an unknown target); 3 the restart lock stayed held;
    5 etcd cannot serve; 7 a wave failed its gate or restart and was rolled back.
    """


@rollout.command("start")
@source_options
@click.option("--env", "env", required=True, metavar="DIR", help="The engine environment.")
@click.option("--model", "model", default=None, metavar="DIR", help="The model revision.")
@click.option("--pair", "pairs", multiple=True, metavar="NAME", help="Only these groups.")
@click.option("--max-unavailable", default="1", show_default=True, help="Groups per wave.")
@click.option("--decode-first", is_flag=True, help="Write decodes' drop-ins before prefills'.")
@prometheus_option
@lock_wait_option
def start(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    env: str,
    model: str | None,
    pairs: tuple[str, ...],
    max_unavailable: str,
    decode_first: bool,
    prometheus: str | None,
    lock_wait: float,
) -> None:
    """Roll every group (or --pair's) to --env [--model], wave by wave, gated.

    The environment (its pyvenv.cfg) and the model revision (its config.json) must be on
    every host already; the gate's thresholds are the profile's rollout: section (defaults
    without -i/-p). Progress on stderr.

    \b
    Example:
      pdctl rollout start --env /opt/pdstack/envs/sglang-0.5.24-9f3e1c2a \\
          --max-unavailable 2 --prometheus http://mon-1:9090 -i inventory.ini
    """
    ops = _ops(topology_path, inventory, profile)
    store, _ = store_of(ops.source)
    dep = ops.source.deployment
    req = ro.Request(
        target=_release(env, model),
        max_unavailable=max_unavailable,
        decode_first=decode_first,
        prometheus=prometheus,
        thresholds=dep.profile.rollout if dep is not None else Rollout(),
    )
    chosen = ops.source.select(pairs, not pairs)
    s = _settings(ops, lock_wait)
    held = ro.lock_held(ops, lock_wait)
    _ended(ro.start(ops, store, chosen, req, s, _query_for(prometheus), held))


def _release(env: str, model: str | None) -> Release:
    try:
        return Release(env=env, model=model)
    except ValidationError as e:
        raise PdctlError(f"unknown target: {e.errors()[0]['msg']} (an absolute path)") from None


@rollout.command("status")
@source_options
@format_option
def status(topology_path: Path, inventory: Path, profile: Path | None, fmt: str) -> None:
    """The rollout's record: its target, each wave and its gate's figures, each group's
    release before and now, who drives it. Exit 0, also with no rollout."""
    store, _ = store_of(load_source(topology_path, inventory, profile))
    rec = Records(store).read()
    driver = controller(store)
    if fmt == "json":
        body = None if rec is None else rec.model_dump(mode="json")
        click.echo(json.dumps({"rollout": body, "controller": driver}, indent=2))
        return
    if rec is None:
        click.echo("no rollout")
        return
    for line in _lines(rec, driver):
        click.echo(line)


def _lines(rec: Record, driver: str | None) -> list[str]:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.started))
    out = [
        f"rollout {rec.id}: {rec.state}, to {rec.target.describe()}, started {at}",
        f"  controller: {driver or 'none'}; last written by {rec.holder}",
    ]
    if rec.message:
        out.append(f"  {rec.message}")
    for n, w in enumerate(rec.waves, 1):
        out.append(f"  wave {n}: {w.state}: {', '.join(w.groups)}")
        out += [f"    {v}" for v in w.verdict]
    for gid, g in rec.groups.items():
        out.append(f"  {gid}: now {describe(g.now)} (before: {describe(g.before)})")
    return out


@rollout.command("pause")
@source_options
def pause(topology_path: Path, inventory: Path, profile: Path | None) -> None:
    """Stop the running rollout before its next step (a restart in flight finishes; a soak
    stops and runs again on resume)."""
    store, _ = store_of(load_source(topology_path, inventory, profile))
    click.echo(ro.pause(store))


@rollout.command("resume")
@source_options
@prometheus_option
@lock_wait_option
def resume(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    prometheus: str | None,
    lock_wait: float,
) -> None:
    """Carry on a paused or failed rollout, or one whose controller died, from any machine:
    a rolled-back wave switches again, a soaking one soaks again."""
    ops = _ops(topology_path, inventory, profile)
    store, _ = store_of(ops.source)
    s = _settings(ops, lock_wait)
    _ended(ro.resume(ops, store, s, _query_for(prometheus), ro.lock_held(ops, lock_wait)))


@rollout.command("undo")
@source_options
@lock_wait_option
def undo(topology_path: Path, inventory: Path, profile: Path | None, lock_wait: float) -> None:
    """Every group the rollout moved back to its release before, the last wave first,
    through the same coordinated restart."""
    ops = _ops(topology_path, inventory, profile)
    store, _ = store_of(ops.source)
    _ended(ro.undo(ops, store, _settings(ops, lock_wait), ro.lock_held(ops, lock_wait)))
