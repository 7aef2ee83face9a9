"""pdctl/envs.py: environments named by their content, built under another name and renamed into
place, units switched to a new path only when the content is the same, and old environments
removed only when nothing uses them (docs/environments.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pdctl import envs, names, render
from pdctl.spec import load_deployment
from tests.conftest import ROOT, filter_plugin

WHEELS = [("pdctl-0.1.0-py3-none-any.whl", "a" * 64), ("pyyaml-6.0-cp311.whl", "b" * 64)]
RUNS = [["pdctl"], ["--no-deps", "nixl-cu12==1.5.1"]]


def test_the_name_says_label_version_and_the_contents_hash() -> None:
    name = envs.env_name("sglang", "0.5.23", WHEELS, RUNS)
    label, version, digest = name.rsplit("-", 2)
    assert (label, version, len(digest)) == ("sglang", "0.5.23", 12)
    assert envs.label_of(name) == "sglang"
    # The wheels' order is pip's, not content: the same set names the same environment.
    assert envs.env_name("sglang", "0.5.23", WHEELS[::-1], RUNS) == name


@pytest.mark.parametrize(
    ("wheels", "runs"),
    [
        ([WHEELS[0], ("pyyaml-6.0-cp311.whl", "c" * 64)], RUNS),  # a rebuilt wheel
        (WHEELS[:1], RUNS),  # one wheel fewer
        (WHEELS, [["pdctl"]]),  # another package list
    ],
)
def test_other_content_gets_another_name(
    wheels: list[tuple[str, str]], runs: list[list[str]]
) -> None:
    assert envs.env_name("sglang", "0.5.23", wheels, runs) != envs.env_name(
        "sglang", "0.5.23", WHEELS, RUNS
    )


def _fake_env(root: Path, dists: dict[str, list[str]], venv_path: str = "") -> Path:
    """A venv-shaped directory with a dist-info RECORD per distribution: its files' lines, and
    pip's own metadata and a script line that carry install details."""
    site = root / "lib" / "python3.11" / "site-packages"
    for dist, lines in dists.items():
        info = site / f"{dist}.dist-info"
        info.mkdir(parents=True)
        extra = [
            f"{dist}.dist-info/INSTALLER,sha256={hashlib.sha256(root.name.encode()).hexdigest()},4",
            f"{dist}.dist-info/direct_url.json,sha256={root.name},90",
            f"../../../bin/{dist},sha256={venv_path or root},200",
            f"{dist}/__pycache__/x.cpython-311.pyc,,",
        ]
        (info / "RECORD").write_text("\n".join([*lines, *extra]) + "\n")
    (root / "bin").mkdir(parents=True, exist_ok=True)
    return root


def test_same_content_ignores_install_metadata_and_allows_an_old_superset(tmp_path: Path) -> None:
    pdctl = ["pdctl/__init__.py,sha256=abc,10"]
    old = _fake_env(
        tmp_path / "venv",
        {"pdctl-0.1.0": pdctl, "smg-1.13.0": ["smg/a.py,sha256=s,1"], "setuptools-65.5.0": []},
    )
    # The seed setuptools the old venv was made with is no content a unit runs.
    new = _fake_env(
        tmp_path / "pdctl-0.1.0-x", {"pdctl-0.1.0": pdctl, "setuptools-84.2.1": ["a,sha256=x,1"]}
    )
    assert envs.same_content(old, new)  # the single venv held every role's packages
    assert not envs.same_content(new, old)  # smg is not in the new one
    changed = _fake_env(
        tmp_path / "pdctl-0.1.0-y", {"pdctl-0.1.0": ["pdctl/__init__.py,sha256=def,10"]}
    )
    assert not envs.same_content(old, changed)
    assert not envs.same_content(old, _fake_env(tmp_path / "empty", {}))


UNIT = """[Service]
ExecStart={gw}/bin/smg launch --pd-disaggregation
ExecStartPost={pd}/bin/pdctl gateway register --gateway h1
"""


def test_repoint_switches_each_executable_only_to_a_same_content_environment(
    tmp_path: Path,
) -> None:
    envs_dir = tmp_path / "envs"
    legacy = _fake_env(
        tmp_path / "venv",
        {"pdctl-0.1.0": ["pdctl/a.py,sha256=1,1"], "smg-1.13.0": ["smg/a,sha256=2,1"]},
    )
    smg = _fake_env(envs_dir / "smg-1.13.0-aaa", {"smg-1.13.0": ["smg/a,sha256=2,1"]})
    pdctl = _fake_env(envs_dir / "pdctl-0.1.0-bbb", {"pdctl-0.1.0": ["pdctl/a.py,sha256=NEW,1"]})
    unit = tmp_path / "pdstack-gateway.service"
    unit.write_text(UNIT.format(gw=legacy, pd=legacy))
    pairs = [("smg", str(smg)), ("pdctl", str(pdctl))]
    rewritten = envs.repoint_units([unit], pairs, str(legacy), str(envs_dir))
    assert rewritten == [str(unit)]
    # smg's content is unchanged: its new path, no restart. pdctl's is new: left for the
    # template to change, which restarts the gateway.
    assert unit.read_text() == UNIT.format(gw=smg, pd=legacy)
    assert envs.repoint_units([unit], pairs, str(legacy), str(envs_dir)) == []
    assert (
        envs.repoint_units([tmp_path / "absent.service"], pairs, str(legacy), str(envs_dir)) == []
    )


def _proc(root: Path, *cmdlines: list[str]) -> Path:
    for pid, argv in enumerate(cmdlines, start=100):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    root.mkdir(exist_ok=True)
    return root


def _aged(path: Path, age_s: float) -> Path:
    path.mkdir(parents=True)
    t = 1_700_000_000 - age_s
    os.utime(path, (t, t))
    return path


def test_prune_keeps_the_newest_per_kind_and_anything_in_use(tmp_path: Path) -> None:
    envs_dir, units = tmp_path / "envs", tmp_path / "units"
    newest = _aged(envs_dir / "sglang-0.5.23-ccc", 0)
    named = _aged(envs_dir / "sglang-0.5.22-bbb", 10)  # a unit file still names it
    running = _aged(envs_dir / "sglang-0.5.21-aaa", 20)  # a process still runs from it
    gone = _aged(envs_dir / "sglang-0.5.20-zzz", 30)
    pdctl_old, pdctl_new = (
        _aged(envs_dir / "pdctl-0.1.0-a", 30),
        _aged(envs_dir / "pdctl-0.1.0-b", 0),
    )
    linked = _aged(envs_dir / "smg-1.12.0-a", 40)  # the link points into it
    _aged(envs_dir / "smg-1.13.0-b", 0)
    dead_build = _aged(envs_dir / f"{envs.BUILD_PREFIX}sglang-0.5.24-d-9", 7200)
    live_build = envs_dir / f"{envs.BUILD_PREFIX}sglang-0.5.24-d-10"
    live_build.mkdir()
    legacy = _aged(tmp_path / "venv", 99)
    (units / "pdstack-pd0-decode.service.d").mkdir(parents=True)
    (units / "pdstack-pd0-decode.service.d" / "x.conf").write_text(
        f"ExecStart={named}/bin/python\n"
    )
    link = tmp_path / "pdctl"
    link.symlink_to(linked / "bin" / "pdctl")
    proc = _proc(
        tmp_path / "proc", [f"{running}/bin/python", "-m", "pdctl.sim"], ["/usr/bin/sleep"]
    )

    removed = envs.prune(envs_dir, legacy, 1, units, [link], proc)

    assert sorted(removed) == sorted(map(str, [gone, pdctl_old, dead_build, legacy]))
    left = {p.name for p in envs_dir.iterdir()}
    assert {newest.name, named.name, running.name, pdctl_new.name, linked.name} <= left
    assert live_build.name in left  # another run's build in progress


def test_the_former_venv_stays_while_a_process_runs_from_it(tmp_path: Path) -> None:
    legacy = _aged(tmp_path / "venv", 0)
    proc = _proc(tmp_path / "proc", [f"{legacy}/bin/python", f"{legacy}/bin/pdctl", "status"])
    units = tmp_path / "units"
    units.mkdir()
    assert envs.prune(tmp_path / "envs", legacy, 2, units, [], proc) == []
    assert envs.prune(tmp_path / "envs", legacy, 2, units, [], _proc(tmp_path / "p2")) == [
        str(legacy)
    ]


def _wheel(directory: Path) -> str:
    """A wheel of one module and a console script, as pip installs them."""
    name = "pdenvtest-1.0-py3-none-any.whl"
    info = "pdenvtest-1.0.dist-info"
    files = {
        "pdenvtest.py": "def main():\n    print('ok')\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: pdenvtest\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\npdenvtest = pdenvtest:main\n",
    }
    record = []
    with zipfile.ZipFile(directory / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(text)}")
        z.writestr(
            "pdenvtest-1.0.dist-info/RECORD",
            "\n".join([*record, "pdenvtest-1.0.dist-info/RECORD,,"]),
        )
    return name


def test_build_renames_a_complete_environment_into_place_once(tmp_path: Path) -> None:
    wheelhouse, envs_dir = tmp_path / "wheels", tmp_path / "envs"
    wheelhouse.mkdir()
    wheel = _wheel(wheelhouse)
    assert envs.build(envs_dir, "t-1.0-abc", sys.executable, str(wheelhouse), [wheel])
    env = envs_dir / "t-1.0-abc"
    assert [p.name for p in envs_dir.iterdir()] == [env.name]  # no build directory left
    # Its script runs from the final path (pip wrote the temporary one into its shebang).
    script = env / "bin" / "pdenvtest"
    assert script.read_text().splitlines()[0] == f"#!{env}/bin/python"
    assert (
        subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout == "ok\n"
    )
    manifest = json.loads((env / envs.MANIFEST).read_text())
    assert manifest == {"name": env.name, "wheels": [wheel]}
    assert not envs.build(envs_dir, "t-1.0-abc", sys.executable, str(wheelhouse), [wheel])
    # A failed build leaves no environment under its name, and no half-built one.
    with pytest.raises(subprocess.CalledProcessError):
        envs.build(envs_dir, "t-1.0-bad", sys.executable, str(wheelhouse), ["missing.whl"])
    assert [p.name for p in envs_dir.iterdir()] == [env.name]
    # The former single venv, installed the way roles/pdstack did (pip by name from the
    # wheelhouse, then pdctl's wheel again by path), holds the same content: a unit moves to
    # the new environment without a restart.
    legacy = tmp_path / "venv"
    pip = [str(legacy / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index"]
    subprocess.run([sys.executable, "-m", "venv", str(legacy)], check=True)
    subprocess.run([*pip, "--find-links", str(wheelhouse), "pdenvtest"], check=True)
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(wheelhouse / wheel)], check=True)
    assert envs.same_content(legacy, env)


def test_units_name_environments_by_slot_and_the_roles_fill_them_in() -> None:
    dep = load_deployment(ROOT / "inventory.ini", ROOT / "deploy" / "profiles" / "sim.yml")
    inst = dep.instances[0]
    slot = render.command(inst, dep)
    assert slot[3] == f"{names.env_slot('engine')}/bin/python"
    built = {"engine": f"{names.ENVS_DIR}/sglang-0.5.23-0123456789ab", "pdctl": "/p"}
    lines = filter_plugin().pdstack_fill_envs(render.command_lines(inst, dep), built)
    assert lines[1].startswith(f"{built['engine']}/bin/python -m pdctl.sim")
    assert f"{names.env_slot('gateway')}/bin/smg" == names.GATEWAY_BIN
    assert filter_plugin().pdstack_fill_envs(render.lease_command("h")[0], built) == "/p/bin/pdctl"


def test_the_controller_resolves_each_wheelhouse_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filters = filter_plugin()
    calls = []

    def resolve(python: str, wheelhouse: str, runs: list[list[str]]) -> list[tuple[str, str]]:
        calls.append(runs)
        return WHEELS

    monkeypatch.setattr(envs, "resolve", resolve)
    packages = {"pdctl": {"label": "pdctl", "version": "0.1.0", "deps": ["pdctl"], "no_deps": []}}
    first = filters.pdstack_envs(packages, str(tmp_path))
    filters._env.cache_clear()  # another Ansible worker: the file beside the wheels answers
    assert filters.pdstack_envs(packages, str(tmp_path)) == first
    assert calls == [[["pdctl"]]]
    name = envs.env_name("pdctl", "0.1.0", WHEELS, [["pdctl"]])
    assert first == {
        "pdctl": {
            "name": name,
            "path": f"{names.ENVS_DIR}/{name}",
            "wheels": sorted(w for w, _ in WHEELS),
        }
    }
