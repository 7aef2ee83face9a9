"""`pdctl model manifest | verify | space | status`: the model revisions pdstack stages
(pdctl.model; docs/models.md)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import click

from pdctl.cli.options import format_option, load_source, source_options
from pdctl.errors import PdctlError
from pdctl.model import manifest
from pdctl.model import status as model_status
from pdctl.model.revisions import DEFAULT_ROOT
from pdctl.ops.context import host_addresses
from pdctl.ops.systemd import Systemctl

GIB = 1 << 30
existing_dir = click.Path(path_type=Path, file_okay=False)


@click.group()
def model() -> None:
    """Model revisions: checksum manifests, staged copies, what each host holds and runs."""


@model.command("manifest")
@click.argument("directory", type=existing_dir)
def manifest_(directory: Path) -> None:
    """Write DIRECTORY/.pdstack-manifest.json: every file's size and sha256.

    Run once on the source revision, after its last change; site.yml copies it with the
    files and every host checks its copy against it."""
    m = manifest.write(directory)
    click.echo(f"{directory}: {len(m.files)} files, {m.total_bytes / GIB:.2f} GiB")


@model.command("verify")
@click.argument("directory", type=existing_dir)
@click.option("--mark", is_flag=True, help="Record the result for `pdctl model status`.")
def verify(directory: Path, mark: bool) -> None:
    """Check every file of DIRECTORY against its manifest: one line per problem (missing,
    not in the manifest, size, sha256), exit 1 when there is one."""
    found = manifest.verify(directory, mark=mark)
    for line in found:
        click.echo(f"{directory}/{line}")
    if found:
        raise PdctlError(f"{directory}: {len(found)} files differ from the manifest")
    click.echo(f"{directory}: every file matches the manifest")


@model.command("space")
@click.argument("directory", type=existing_dir)
@click.option("--margin-gib", type=click.FloatRange(min=0), default=10.0, show_default=True)
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The source's manifest (default: DIRECTORY's own); DIRECTORY may not exist yet.",
)
def space(directory: Path, margin_gib: float, manifest_file: Path | None) -> None:
    """Is there room for the rest of the copy into DIRECTORY, leaving --margin-gib free?
    Exit 2 with one line when there is not."""
    room = manifest.space(directory, int(margin_gib * GIB), manifest_file)
    line = (
        f"{directory}: {room.missing_bytes / GIB:.2f} GiB to copy, "
        f"{room.free_bytes / GIB:.2f} GiB free, margin {margin_gib:g} GiB"
    )
    if not room.enough:
        raise PdctlError(f"not enough disk: {line}")
    click.echo(line)


def _fleet_rows(
    topology_path: Path, inventory: Path, profile: Path | None, root: str | None
) -> list[model_status.HostModels]:
    """Every GPU host's answer: the hosts and their engines' units from the deployment."""
    source = load_source(topology_path, inventory, profile)
    dep = source.deployment
    root = root or (dep.profile.model.staging.root if dep else DEFAULT_ROOT)
    addresses = host_addresses(source)
    hosts: dict[str, tuple[str, list[str]]] = {}
    for i in source.topology.instances:
        hosts.setdefault(i.host, (addresses[i.host], []))[1].append(i.unit)
    return model_status.fleet_models(hosts, root)


@model.command("status")
@source_options
@click.option("--root", default=None, help="Staging root (default: the profile's).")
@click.option("--local", is_flag=True, help="This host only (what the fleet form runs).")
@click.option("--host", "host_name", default=None, help="With --local: the host's name.")
@click.option("--unit", "units", multiple=True, help="With --local: an engine unit to read.")
@format_option
def status(
    topology_path: Path,
    inventory: Path,
    profile: Path | None,
    root: str | None,
    local: bool,
    host_name: str | None,
    units: tuple[str, ...],
    fmt: str,
) -> None:
    """Which revisions each GPU host holds (verified or partial), and which each engine runs."""
    if local:
        host = host_name or socket.gethostname()
        systemd = Systemctl(host)
        rows = [model_status.host_models(host, root or DEFAULT_ROOT, list(units), systemd)]
    else:
        rows = _fleet_rows(topology_path, inventory, profile, root)
    if fmt == "json":
        click.echo(json.dumps([model_status.to_json(r) for r in rows], indent=2))
    else:
        click.echo("\n".join(model_status.table(rows)))
