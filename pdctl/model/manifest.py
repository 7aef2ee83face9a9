"""A revision's checksum manifest: made once on the source (`pdctl model manifest DIR`), copied
with the files, checked on every host after the copy (`pdctl model verify DIR`).

`.pdstack-manifest.json` in the revision directory holds every file's size and sha256; a host
that verified its copy writes `.pdstack-verified` naming the manifest's own sha256, so
`pdctl model status` tells a verified revision from a partial or unchecked one without reading
the weights again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pdctl.errors import PdctlError

MANIFEST = ".pdstack-manifest.json"
VERIFIED = ".pdstack-verified"
# pdstack's own files in a revision directory: never listed, never "extra".
OWN_FILES = frozenset({MANIFEST, VERIFIED})
# Large reads: hashlib releases the GIL on each, so files hash in parallel threads.
READ_BYTES = 8 << 20
HASH_THREADS = 4
FORMAT = 1


class ManifestError(PdctlError):
    """A directory with no manifest, or one that cannot be read."""


@dataclass(frozen=True)
class Entry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: dict[str, Entry]  # by path relative to the revision directory, '/'-separated

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def dumps(self) -> str:
        files = {k: {"size": e.size, "sha256": e.sha256} for k, e in sorted(self.files.items())}
        doc = {"format": FORMAT, "total_bytes": self.total_bytes, "files": files}
        return json.dumps(doc, indent=1) + "\n"


def files_under(root: Path) -> Iterator[str]:
    """Every regular file below root, relative and '/'-separated, pdstack's own left out."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in OWN_FILES:
                yield rel


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(READ_BYTES):
            h.update(chunk)
    return h.hexdigest()


def make(root: Path) -> Manifest:
    """The manifest of every file under root (the source revision directory)."""
    if not root.is_dir():
        raise ManifestError(f"{root}: no such directory")
    names = list(files_under(root))
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(lambda rel: sha256_of(root / rel), names))
    sizes = [(root / rel).stat().st_size for rel in names]
    return Manifest({n: Entry(s, d) for n, s, d in zip(names, sizes, digests, strict=True)})


def write(root: Path) -> Manifest:
    manifest = make(root)
    (root / MANIFEST).write_text(manifest.dumps())
    return manifest


def read(root: Path) -> Manifest:
    if not root.is_dir():
        raise ManifestError(f"{root}: no such directory")
    return read_file(root / MANIFEST)


def read_file(path: Path) -> Manifest:
    try:
        doc = json.loads(path.read_text())
        files = doc["files"].items()
        return Manifest({k: Entry(int(v["size"]), str(v["sha256"])) for k, v in files})
    except FileNotFoundError:
        raise ManifestError(
            f"{path.parent}: no {path.name}: make it once on the source (pdctl model manifest DIR)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"{path}: not a pdstack manifest ({e})") from None


def manifest_digest(root: Path) -> str:
    return sha256_of(root / MANIFEST)


def _size_problem(root: Path, rel: str, entry: Entry) -> str | None:
    try:
        size = (root / rel).stat().st_size
    except FileNotFoundError:
        return f"{rel}: missing"
    if size != entry.size:
        return f"{rel}: {size} bytes, the manifest says {entry.size}"
    return None


def problems(root: Path, manifest: Manifest) -> list[str]:
    """One line per file that differs: missing, extra, wrong size (checked first, cheaply),
    wrong sha256; empty when the directory is exactly the manifest's."""
    sized = {rel: p for rel, e in manifest.files.items() if (p := _size_problem(root, rel, e))}
    extra = sorted(set(files_under(root)) - set(manifest.files))
    found = [*sized.values(), *(f"{rel}: not in the manifest" for rel in extra)]
    to_hash = [rel for rel in manifest.files if rel not in sized]
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = pool.map(lambda rel: sha256_of(root / rel), to_hash)
        for rel, digest in zip(to_hash, digests, strict=True):
            want = manifest.files[rel].sha256
            if digest != want:
                found.append(f"{rel}: sha256 {digest[:12]}, the manifest says {want[:12]}")
    return found


def verify(root: Path, mark: bool = False) -> list[str]:
    """`problems` against the directory's own manifest. mark: record the result for `pdctl
    model status` (the marker written on success, removed on failure)."""
    manifest = read(root)
    found = problems(root, manifest)
    if mark:
        marker = root / VERIFIED
        if found:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(json.dumps({"manifest_sha256": manifest_digest(root)}) + "\n")
    return found


def is_verified(root: Path) -> bool:
    """The marker names the manifest now in the directory: a copy verified since its last
    change (a new manifest, from a re-staged revision, voids it)."""
    try:
        recorded = json.loads((root / VERIFIED).read_text())["manifest_sha256"]
        return bool(recorded == manifest_digest(root))
    except (OSError, ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True)
class Space:
    missing_bytes: int  # what the copy still has to write
    free_bytes: int
    margin_bytes: int

    @property
    def enough(self) -> bool:
        return self.free_bytes - self.missing_bytes >= self.margin_bytes


def space(root: Path, margin_bytes: int, manifest_file: Path | None = None) -> Space:
    """Room for the rest of the copy into root: by its own manifest, or by manifest_file (the
    source's, fetched before anything else, root perhaps not made yet). Files present count
    for what they hold already, as rsync --append-verify resumes them in place."""
    manifest = read_file(manifest_file) if manifest_file else read(root)
    held = 0
    for rel, entry in manifest.files.items():
        with contextlib.suppress(FileNotFoundError):
            held += min((root / rel).stat().st_size, entry.size)
    existing = next(p for p in (root, *root.parents) if p.is_dir())
    free = shutil.disk_usage(existing).free
    return Space(manifest.total_bytes - held, free, margin_bytes)
