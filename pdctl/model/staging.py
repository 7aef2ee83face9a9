"""The copy of a revision onto a GPU host: the rsync command site.yml runs
(roles/pdstack_engine/tasks/stage.yml, through filter_plugins/pdstack.py) and the rehearsal and
benchmark run the same way.

rsync -a copies files with their times, so a re-run skips what is there; --partial keeps a
file cut off mid-copy, and --append-verify resumes it from where it stopped, then checks the
whole file's checksum (re-sending it when that differs). A file of the right size but wrong
bytes is not rsync's to find: `pdctl model verify` does, after every copy.
"""

from __future__ import annotations

# Plain strings, not the profile's models: the roles' filter calls this in every Ansible worker,
# which must not import pydantic (filter_plugins/pdstack.py).
CONTROLLER, STAGING = "controller", "staging"  # pdctl.spec.profile.SourceKind's values
RSYNC_FLAGS = ["-a", "--partial", "--append-verify", "--itemize-changes"]


def _src(path: str, only: str | None) -> str:
    base = path.rstrip("/")
    return f"{base}/{only}" if only else f"{base}/"


def rsync_argv(
    kind: str,
    path: str,
    dest: str,
    address: str | None = None,
    ssh_config: str | None = None,
    only: str | None = None,
) -> list[str]:
    """rsync's argv: the revision's files at the source's path (or its one file `only`) into
    dest. The controller pushes its own directory to the host at `address` over ssh (-F
    ssh_config: Ansible's way to the host); a host pulls from a staging host over its own ssh,
    or copies from the path it shares (NFS) to its local disk."""
    ssh = ["ssh", "-o", "BatchMode=yes"]
    argv = ["rsync", *RSYNC_FLAGS]
    if kind == CONTROLLER:
        ssh += ["-F", ssh_config] if ssh_config else []
        return [*argv, "-e", " ".join(ssh), _src(path, only), f"root@{address}:{dest}"]
    if kind == STAGING:
        argv += ["-e", " ".join(ssh)]  # the host's own ssh settings
    return [*argv, _src(path, only), dest]
