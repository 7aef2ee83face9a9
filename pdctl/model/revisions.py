"""Staged revisions on a host, and which one an engine runs.

A revision lives in `<staging root>/<served_name>/<revision>` (`revision_dir`), copied and
verified by site.yml (roles/pdstack_engine/tasks/stage.yml) and never written again: staging
another revision makes another directory, so it cannot change what a running engine reads.
An engine runs the revision its process was started with (`running_revision` of its
`--model-path`); it moves to another only when its unit is restarted with the new path, which
only a roll or rollout does. The rollout asks `staged_revisions` which hosts hold the target
verified before its first wave.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pdctl.model import manifest

DEFAULT_ROOT = "/var/lib/pdstack/models"


def revision_dir(root: str, served_name: str, revision: str) -> str:
    return str(PurePosixPath(root) / served_name / revision)


@dataclass(frozen=True)
class Staged:
    served_name: str
    revision: str
    path: str
    # Copied and checked against its manifest since the manifest last changed; False: a copy
    # in progress, interrupted, or refused by `pdctl model verify`.
    verified: bool


def staged_revisions(root: Path) -> list[Staged]:
    """Every revision directory under root, in name order; none when root does not exist."""
    if not root.is_dir():
        return []
    return [
        Staged(model.name, rev.name, str(rev), manifest.is_verified(rev))
        for model in _dirs(root)
        for rev in _dirs(model)
    ]


def _dirs(parent: Path) -> list[Path]:
    """Its directories, dot directories (staging's own: .incoming) left out."""
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def model_path_arg(argv: list[str]) -> str | None:
    """The --model-path (or its alias --model) an engine's command line carries."""
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in ("--model-path", "--model"):
            if eq:
                return value
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def running_revision(root: str, model_path: str) -> tuple[str, str] | None:
    """(served_name, revision) when model_path is a revision directory under root; None for a
    model path that pdstack did not stage (model.path alone, a hub id)."""
    path, base = PurePosixPath(model_path), PurePosixPath(root)
    if path.parent.parent == base and path.name and path.parent.name:
        return path.parent.name, path.name
    return None
