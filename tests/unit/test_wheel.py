"""pdctl installed from its wheel, outside the checkout, renders: the templates ship in it.

Offline and quick: the wheel is built without build isolation (the venv's setuptools) from a
copy of the sources, installed with --no-deps into a fresh venv, and the dependencies come from
the project venv's site-packages on PYTHONPATH (which holds no `pdctl` package of its own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert out.returncode == 0, f"{cmd}: {out.stdout[-2000:]}{out.stderr[-4000:]}"
    return out.stdout


def test_wheel_installed_pdctl_renders_outside_the_checkout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    # A copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    for tree in ("pdctl", "templates"):
        shutil.copytree(ROOT / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", wheels, src, cwd=tmp_path)  # fmt: skip
    (wheel,) = wheels.glob("pdctl-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    # The top-level templates/ ships as pdctl/templates; pyproject.toml's package list misses
    # no module or data file of the checkout.
    templates = {f"pdctl/templates/{p.name}" for p in (ROOT / "templates").glob("*.j2")}
    package = [*(ROOT / "pdctl").rglob("*.py"), *(ROOT / "pdctl" / "data").glob("*.txt")]
    expected = templates | {p.relative_to(ROOT).as_posix() for p in package}
    assert {"pdctl/templates/engine.service.j2", "pdctl/data/sglang-0.5.23-flags.txt"} <= expected
    assert expected <= shipped, sorted(expected - shipped)

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    _run(sys.executable, "-m", "pip", "--python", venv / "bin/python", "install", "-q",
         "--no-deps", "--no-index", wheel, cwd=tmp_path)  # fmt: skip

    # Dependencies from the project venv; nothing from the checkout (cwd and sys.path).
    deps = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": deps}
    where = _run(venv / "bin/python", "-c", "import pdctl; print(pdctl.__file__)",
                 cwd=tmp_path, env=env)  # fmt: skip
    assert where.strip().startswith(str(venv)), where

    inventory = ROOT / "deploy/examples/two-hosts.ini"
    out = _run(venv / "bin/pdctl", "render", "-i", inventory, "--instance", "gpu-node-2/pd0-decode",
               "--format", "json", cwd=tmp_path, env=env)  # fmt: skip
    (inst,) = json.loads(out)["instances"]
    assert inst["unit"] == "pdstack-pd0-decode.service"
    assert "\nPartOf=pdstack-pd0.target\n" in inst["unit_file"]
    assert "\nEnvironmentFile=/etc/pdstack/pd0-decode.env\n" in inst["unit_file"]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7\n" in inst["env_file_text"]
