"""Staging a model revision as site.yml does: roles/pdstack_engine/tasks/stage.yml run by real
Ansible on this machine, copying with real rsync from a shared path (two local directories)
and verifying with pdctl; a copy cut off resumes; a corrupted file, a missing source and a
full disk are each refused in one line with the engines untouched (docs/models.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl.model import manifest, staging
from pdctl.model.revisions import staged_revisions
from pdctl.testing import dummy_model
from tests.conftest import ROOT, require_tool

STAGE_TASKS = ROOT / "roles" / "pdstack_engine" / "tasks" / "stage.yml"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A revision made once, its manifest beside it, as an operator prepares one."""
    root = tmp_path_factory.mktemp("source") / "r1"
    dummy_model.make(root, mib=8, shards=2)
    manifest.write(root)
    return root


def _venv(tmp_path: Path) -> Path:
    """A stand-in for the host's venv whose bin/pdctl is this checkout's."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    pdctl = venv / "bin" / "pdctl"
    pdctl.write_text(
        f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -c "
        '\'import sys; sys.argv[0] = "pdctl"; from pdctl.cli import main; main()\' "$@"\n'
    )
    pdctl.chmod(0o755)
    return venv


def _facts(tmp_path: Path, source: Path, root: Path, margin_gib: float) -> dict[str, Any]:
    """A host's variables as site.yml's deployment gives them (filter_plugins/pdstack.py's
    _model), for a shared source."""
    model: dict[str, Any] = {
        "staged": True, "kind": "shared", "source": str(source), "revision": source.name,
        "dir": f"{root}/sim/{source.name}", "root": str(root),
        "incoming": f"{root}/.incoming/sim-{source.name}.json",
        "manifest": manifest.MANIFEST, "verified": manifest.VERIFIED,
        "margin_gib": margin_gib, "concurrency": 2,
    }  # fmt: skip
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "_pdstack_engine_model": model,
        "_pdstack_engine_host": {"address": "127.0.0.1"},
        "_pdstack_engine_layout": {"venv": str(_venv(tmp_path))},
        "_pdstack_engine_stage_on_controller": False,
        "_pdstack_engine_stage_ssh": str(tmp_path / "unused.ssh"),
    }


def stage(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """stage.yml in one real Ansible run over `hosts` {name: variables}, all this machine
    (apt left out: it has rsync); each host's failure message, None where it passed."""
    require_tool("rsync")
    playbook = ROOT / ".venv" / "bin" / "ansible-playbook"
    if not playbook.exists():
        pytest.skip(f"{playbook} not found; run scripts/setup.sh")
    (tmp_path / "host_vars").mkdir(exist_ok=True)
    for name, facts in hosts.items():
        (tmp_path / "host_vars" / f"{name}.json").write_text(json.dumps(facts))
    (tmp_path / "hosts.ini").write_text("\n".join(["[stage]", *hosts, ""]))
    play = [{"hosts": "stage", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_tasks": str(STAGE_TASKS)}]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, PYTHONPATH=str(ROOT), ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    run = subprocess.run(
        [str(playbook), "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "play.yml"),
         "--skip-tags", "pdstack_engine_stage_apt"],
        cwd=ROOT, env=env, text=True, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    failed = dict(re.findall(r"^fatal: \[([\w-]+)\]: FAILED! => (\{.*\})$", run.stdout, re.M))
    recap = dict(re.findall(r"^([\w-]+)\s+: ok=\d+\s+changed=(\d+)", run.stdout, re.M))
    assert set(recap) == set(hosts), run.stdout[-3000:] + run.stderr[-2000:]
    return {h: json.loads(failed[h])["msg"] if h in failed else None for h in hosts} | {
        f"{h} changed": recap[h] for h in hosts
    }


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory, source: Path) -> dict[str, Any]:
    """One run over four hosts: a good source, a corrupted one, a missing one, a full disk."""
    tmp = tmp_path_factory.mktemp("stage")
    bad = tmp / "bad-source" / "r2"
    shutil.copytree(source, bad)
    shard = bad / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # after the manifest was made: same size, other bytes
    shard.write_bytes(bytes(data))
    roots = {h: tmp / h for h in ("good", "corrupt", "missing", "full")}
    hosts = {
        "good": _facts(tmp, source, roots["good"], 0),
        "corrupt": _facts(tmp, bad, roots["corrupt"], 0),
        "missing": _facts(tmp, tmp / "nowhere" / "r1", roots["missing"], 0),
        "full": _facts(tmp, source, roots["full"], 1e9),
    }
    return {"tmp": tmp, "roots": roots, "hosts": hosts, "result": stage(tmp, hosts)}


def test_a_revision_is_copied_verified_and_marked(staged: dict[str, Any]) -> None:
    [held] = staged_revisions(staged["roots"]["good"])
    assert (held.served_name, held.revision, held.verified) == ("sim", "r1", True)
    assert manifest.verify(Path(held.path)) == []


def test_a_host_that_cannot_stage_stops_the_others_after_their_try(
    staged: dict[str, Any],
) -> None:
    """The good host staged its copy (above), then stopped with the fleet: nothing after
    staging (the engines' files, the roll) runs anywhere."""
    line = staged["result"]["good"]
    named, _, rest = line.partition(" could not stage ")
    assert sorted(named.split(", ")) == ["corrupt", "full", "missing"]
    assert rest.endswith("no engine was restarted") and "\n" not in line


def test_a_copy_cut_off_resumes_and_verifies(staged: dict[str, Any]) -> None:
    [held] = staged_revisions(staged["roots"]["good"])
    shard = Path(held.path) / "model-00002-of-00002.safetensors"
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size // 3)
    (Path(held.path) / manifest.VERIFIED).unlink()  # as a run killed before its verify
    again = stage(staged["tmp"], {"good": staged["hosts"]["good"]})
    assert again["good"] is None
    assert again["good changed"] == "1"  # the copy, and only it
    assert staged_revisions(staged["roots"]["good"])[0].verified


def test_rsync_sends_only_what_a_cut_off_file_lacks(tmp_path: Path, source: Path) -> None:
    require_tool("rsync")
    dest = tmp_path / "dest"
    argv = staging.rsync_argv("shared", str(source), f"{dest}/")
    subprocess.run(argv, check=True, capture_output=True)
    shard = dest / "model-00001-of-00002.safetensors"
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 4)
    out = subprocess.run([*argv, "--stats"], check=True, capture_output=True, text=True).stdout
    literal = next(ln for ln in out.splitlines() if ln.startswith("Literal data:"))
    sent = int(literal.split(":")[1].split()[0].replace(",", ""))
    assert sent == size - size // 4
    assert manifest.verify(dest) == []


def test_a_corrupted_file_is_refused_in_one_line(staged: dict[str, Any]) -> None:
    line = staged["result"]["corrupt"]
    assert line.startswith("corrupt: ") and "\n" not in line
    assert "model-00001-of-00002.safetensors: sha256" in line
    assert "1 files differ from the manifest" in line
    assert [s.verified for s in staged_revisions(staged["roots"]["corrupt"])] == [False]


def test_a_missing_source_is_refused_before_anything_is_made(staged: dict[str, Any]) -> None:
    line = staged["result"]["missing"]
    assert line.startswith("missing: model.source ") and "\n" not in line
    assert "cannot read its .pdstack-manifest.json" in line
    assert staged_revisions(staged["roots"]["missing"]) == []


def test_a_full_disk_is_refused_before_the_copy(staged: dict[str, Any]) -> None:
    line = staged["result"]["full"]
    assert line.startswith("full: Error: not enough disk: ") and "\n" not in line
    assert staged_revisions(staged["roots"]["full"]) == []
