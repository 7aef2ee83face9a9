"""Side-by-side environments: each engine, gateway and pdctl runs from a venv named by its content.

`/opt/pdstack/envs/<label>-<version>-<hash12>`, where the hash is the sha256 of the wheels that
go in (file name and sha256 each, as pip resolves them from the wheelhouse) and the package
lists: the same content always gets the same name, a new wheel a new one. An environment is
built under a temporary name and renamed into place, so one that exists is complete; nothing
modifies it afterwards. docs/environments.md has the model; the roles run this file on the hosts
with the system Python, before any pdctl is installed there, so it imports the standard library
only. The controller's side (`resolve`, `env_name`) runs in the Ansible filter plugin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

# One pip run per list: [extra pip arguments (--no-deps), requirement, ...]. pip's own
# metadata files differ between two installs of the same wheel; scripts carry the venv's path.
PIP_METADATA = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
# A venv's seed (ensurepip) and its installer: an older venv keeps whatever version it was
# created with while that satisfies its packages, where a new one installs the wheelhouse's.
# Never what a unit runs, so not part of what "the same content" compares.
SEED = {"pip", "setuptools", "wheel"}
MANIFEST = ".pdstack-env.json"  # what went in, written into each environment
BUILD_PREFIX = ".build-"  # an environment being built; never referenced by a unit
HASH_CHARS = 12


def split_run(run: Sequence[str]) -> tuple[list[str], list[str]]:
    """A run's pip options (leading `--…`) and its requirements."""
    options = [w for w in run if w.startswith("--")]
    return options, [w for w in run if not w.startswith("--")]


def env_name(
    label: str, version: str, wheels: Iterable[tuple[str, str]], runs: Sequence[Sequence[str]]
) -> str:
    """`<label>-<version>-<hash12>`: the hash over the (file name, sha256) of every wheel that goes
    in, in any order, and the package lists in their order (pip runs them in turn)."""
    content = {"wheels": sorted(set(wheels)), "runs": [list(r) for r in runs]}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return f"{label}-{version}-{digest[:HASH_CHARS]}"


def resolve(python: str, wheelhouse: str, runs: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """The wheels each run installs from `wheelhouse` into an empty venv, as pip resolves them
    (`pip install --dry-run --report`, offline, on the controller whose Python the wheels are
    built for): (file name, sha256) each."""
    wheels: list[tuple[str, str]] = []
    for run in runs:
        options, packages = split_run(run)
        if not packages:
            continue
        with tempfile.NamedTemporaryFile(suffix=".json") as report:
            subprocess.run(
                [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
                 "--disable-pip-version-check", "--quiet", "--find-links", wheelhouse,
                 "--report", report.name, *options, *packages],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            for item in json.loads(Path(report.name).read_text())["install"]:
                info = item["download_info"]
                wheels.append(
                    (info["url"].rsplit("/", 1)[-1], info["archive_info"]["hashes"]["sha256"])
                )
    return wheels


def distributions(env: Path) -> dict[str, str]:
    """What an environment holds: per installed distribution (its dist-info name, with the
    version), the sha256 of its RECORD's lines for files inside site-packages other than pip's
    install metadata. Scripts (paths outside site-packages, which carry the venv's path in their
    shebang), byte code and the venv's seed packages (SEED) are left out: two installs of the
    same wheels give the same."""
    out: dict[str, str] = {}
    for record in sorted(env.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        if record.parent.name.split("-", 1)[0].lower() in SEED:
            continue
        lines = []
        for line in record.read_text().splitlines():
            path = line.rsplit(",", 2)[0]
            if (
                path.startswith("../")
                or "__pycache__" in path
                or path.rsplit("/", 1)[-1] in PIP_METADATA
            ):
                continue
            lines.append(line)
        out[record.parent.name] = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
    return out


def same_content(old: Path, new: Path) -> bool:
    """Whether a process started from `old` runs what `new` holds: every distribution of `new`
    is in `old`, file for file. `old` may hold more (the former single venv held every role's
    packages): a process never imports what its own environment would not have."""
    held = distributions(old)
    wanted = distributions(new)
    return bool(wanted) and all(held.get(d) == h for d, h in wanted.items())


def _rewrite_bin(tmp: Path, final: Path) -> None:
    """Point the scripts pip wrote (shebangs, activate) at the final path: a venv records its
    own path in them, and this one was built under another name."""
    old, new = str(tmp).encode(), str(final).encode()
    for path in [*(tmp / "bin").iterdir(), tmp / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


def build(envs_dir: Path, name: str, python: str, wheelhouse: str, wheels: Sequence[str]) -> bool:
    """Build environment `name` unless it exists: a venv under a temporary name, then exactly
    the `wheels` that named it (files in the host's wheelhouse, which also holds other
    versions: no resolution here), then one rename into place. False when it existed."""
    final = envs_dir / name
    if final.is_dir():
        return False
    envs_dir.mkdir(parents=True, exist_ok=True)
    tmp = envs_dir / f"{BUILD_PREFIX}{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run([python, "-m", "venv", str(tmp)], check=True)
        subprocess.run(
            [str(tmp / "bin/python"), "-m", "pip", "install", "--no-index", "--no-deps",
             "--disable-pip-version-check", "--quiet", *(f"{wheelhouse}/{w}" for w in wheels)],
            check=True,
        )  # fmt: skip
        _rewrite_bin(tmp, final)
        (tmp / MANIFEST).write_text(json.dumps({"name": name, "wheels": sorted(wheels)}) + "\n")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def env_refs(text: str, exe: str, legacy: str, envs_dir: str) -> set[str]:
    """The environments `text` (a unit file) runs `bin/<exe>` from: the former single venv or
    any under `envs_dir`."""
    pattern = (
        rf"({re.escape(legacy)}|{re.escape(envs_dir)}/[A-Za-z0-9_.+-]+)/bin/{re.escape(exe)}\b"
    )
    return set(re.findall(pattern, text))


def repoint(text: str, exe: str, new: str, same: set[str]) -> str:
    """`text` with every `<old>/bin/<exe>` for an `old` in `same` run from `new` instead."""
    for old in same:
        text = re.sub(rf"{re.escape(old)}(?=/bin/{re.escape(exe)}\b)", new, text)
    return text


def repoint_units(
    units: Iterable[Path], pairs: Sequence[tuple[str, str]], legacy: str, envs_dir: str
) -> list[str]:
    """Switch units whose environment's content did not change to the new environment's path,
    in place (`pairs`: (executable, new environment)). The roles do this before they write the
    units: the written unit is then unchanged, and nothing restarts for a new path alone; the
    running process keeps its files (`in_use` keeps them). Returns the units rewritten."""
    changed = []
    for unit in units:
        if not unit.is_file():
            continue
        text = original = unit.read_text()
        for exe, new in pairs:
            olds = env_refs(text, exe, legacy, envs_dir) - {new}
            same = {o for o in olds if Path(o).is_dir() and same_content(Path(o), Path(new))}
            text = repoint(text, exe, new, same)
        if text != original:
            unit.write_text(text)
            changed.append(str(unit))
    return changed


def in_use(env: str, unit_dir: Path, proc: Path, links: Iterable[Path]) -> bool:
    """Whether a unit file (or drop-in) names `env`, a process runs from it (an argument under
    it: the engines' `<env>/bin/python`, a script's interpreter), or a link points into it."""
    prefix = env.rstrip("/") + "/"
    for path in unit_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and prefix in path.read_text(errors="replace"):
            return True
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended
            continue
        if any(a.decode(errors="replace").startswith(prefix) for a in args):
            return True
    return any(os.path.realpath(link).startswith(prefix) for link in links if link.is_symlink())


def label_of(name: str) -> str:
    """`sglang` of `sglang-0.5.23-<hash>`: the kind an environment is kept per."""
    return name.rsplit("-", 2)[0]


def stale(envs_dir: Path, keep: int) -> list[Path]:
    """Environments beyond the `keep` newest of their kind, and builds left by a dead run."""
    envs = [p for p in envs_dir.iterdir() if p.is_dir()] if envs_dir.is_dir() else []
    builds = [p for p in envs if p.name.startswith(BUILD_PREFIX)]
    done = sorted(
        (p for p in envs if p not in builds), key=lambda p: p.stat().st_mtime, reverse=True
    )
    by_label: dict[str, list[Path]] = {}
    for p in done:
        by_label.setdefault(label_of(p.name), []).append(p)
    return builds + [p for kept in by_label.values() for p in kept[keep:]]


def prune(
    envs_dir: Path,
    legacy: Path,
    keep: int,
    unit_dir: Path,
    links: Sequence[Path],
    proc: Path = Path("/proc"),
) -> list[str]:
    """Remove the stale environments and the former single venv that nothing uses. Builds in
    progress elsewhere are left alone for an hour (another run's)."""
    removed = []
    for env in [*stale(envs_dir, keep), legacy]:
        if not env.is_dir() or in_use(str(env), unit_dir, proc, links):
            continue
        if env.name.startswith(BUILD_PREFIX) and time.time() - env.stat().st_mtime < 3600:
            continue
        shutil.rmtree(env)
        removed.append(str(env))
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdstack-envs", description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build an environment unless it exists")
    b.add_argument("--envs-dir", type=Path, required=True)
    b.add_argument("--name", required=True)
    b.add_argument("--python", required=True)
    b.add_argument("--wheelhouse", required=True)
    b.add_argument("--wheels", required=True, help="JSON list of the wheels' file names")
    r = sub.add_parser("repoint", help="switch units to a new environment of the same content")
    r.add_argument("--envs-dir", required=True)
    r.add_argument("--legacy", required=True)
    r.add_argument("--env", action="append", default=[], metavar="EXE=ENV")
    r.add_argument("units", nargs="*", type=Path)
    p = sub.add_parser("prune", help="remove environments beyond --keep per kind that nothing uses")
    p.add_argument("--envs-dir", type=Path, required=True)
    p.add_argument("--legacy", type=Path, required=True)
    p.add_argument("--keep", type=int, required=True)
    p.add_argument("--unit-dir", type=Path, required=True)
    p.add_argument("--link", type=Path, action="append", default=[])
    a = ap.parse_args(argv)
    if a.cmd == "build":
        result: object = {
            "built": build(a.envs_dir, a.name, a.python, a.wheelhouse, json.loads(a.wheels))
        }
    elif a.cmd == "repoint":
        pairs = [tuple(e.split("=", 1)) for e in a.env]
        result = {"rewritten": repoint_units(a.units, pairs, a.legacy, a.envs_dir)}
    else:
        result = {"removed": prune(a.envs_dir, a.legacy, a.keep, a.unit_dir, a.link)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
