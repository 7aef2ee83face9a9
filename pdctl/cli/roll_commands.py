"""`pdctl roll`: site.yml's config-change roll, a JSON plan in and a JSON result out
(pdctl.ops.site_roll)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
from pydantic import ValidationError

from pdctl.cli.options import load_source, source_options
from pdctl.errors import PdctlError
from pdctl.ops import site_roll
from pdctl.ops.context import real_ops, restart_lock, to_stderr


@click.command()
@source_options
@click.option(
    "--plan",
    "plan_file",
    type=click.File("r"),
    required=True,
    metavar="FILE",
    help="The plan (JSON; - reads stdin): groups, max_unavailable, lock_wait, ssh_config.",
)
def roll(topology_path: Path, inventory: Path, profile: Path | None, plan_file: IO[str]) -> None:
    """Roll the groups a config change changed, as site.yml does: one call, JSON in and out.

    The plan names the groups ({"groups": ["HOST/NAME", ...]}), how many roll at once
    ("max_unavailable": "1", as --max-unavailable; above 1 with the floor of all groups but K
    and --include-drained), how long to wait for the restart lock ("lock_wait": seconds), and,
    for a roll of several hosts run from the controller, an ssh config file's text
    ("ssh_config"): pdctl then checks first that it reaches every host as root and every
    engine's port, and takes its host lock in a folder of its own. The groups restart as
    `pdctl restart --both --pair ... --yes` restarts them; progress goes to stderr.

    stdout: the result as JSON: ok, exit, error (why the roll stopped before its groups),
    message (the one line to show for a failure), and per group its id, outcome (restarted,
    failed, not started, interrupted, untouched), the last step it began, its step times, its
    error ({phase, message}) and, failed, its units' last journal lines.

    \b
    Exit codes: as pdctl restart: 0 done; 1 a group failed or the floor was not met; 2 bad
    plan or refused; 3 the lock stayed held; 5 etcd cannot serve; 130 interrupted.
    \b
    Example:
      echo '{"groups": ["gpu-1/pd0"], "lock_wait": 600}' | pdctl roll --plan -
    """
    try:
        plan = site_roll.Plan.model_validate_json(plan_file.read())
    except ValidationError as e:
        why = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or 'top level'}: {x['msg']}"
            for x in e.errors(include_url=False)
        )
        result = site_roll.refused([], PdctlError(f"the plan is not valid: {why}"))
    else:
        result = _run(plan, topology_path, inventory, profile)
    click.echo(result.model_dump_json(indent=2))
    sys.exit(result.exit)


def _run(
    plan: site_roll.Plan, topology_path: Path, inventory: Path, profile: Path | None
) -> site_roll.Result:
    with _own_folder(plan) as folder:
        ssh_config = lock_path = None
        if folder is not None:
            ssh_config, lock_path = folder / "ssh_config", folder / "restart.lock"
            ssh_config.write_text(plan.ssh_config or "")
        try:
            source = load_source(topology_path, inventory, profile)
            ops = real_ops(source, ssh_config=None if ssh_config is None else str(ssh_config))
            fleet = restart_lock(ops, False, to_stderr)
        except PdctlError as e:
            return site_roll.refused(plan.groups, e)
        return site_roll.run(ops, plan, fleet, lock_path)


@contextlib.contextmanager
def _own_folder(plan: site_roll.Plan) -> Iterator[Path | None]:
    """A roll from the controller (the plan has ssh settings) keeps its ssh config and its
    host lock in a private folder of its own, removed after: another user than root cannot
    take /run/pdstack's lock, and the fleet lock in etcd is what keeps restarts apart."""
    if plan.ssh_config is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="pdctl-roll-") as folder:
        yield Path(folder)
