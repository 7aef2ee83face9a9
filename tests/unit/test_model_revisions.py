"""The profile's model source and revision, the staged revision directories on a host, which
revision an engine runs, and `pdctl model status` over the fleet (pdctl.model)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdctl import render
from pdctl.model import manifest, staging
from pdctl.model import status as model_status
from pdctl.model.revisions import (
    model_path_arg,
    revision_dir,
    running_revision,
    staged_revisions,
)
from pdctl.ops.systemd import HostError, UnitStatus
from pdctl.spec import Deployment
from tests.conftest import filter_plugin, run_pdctl

SOURCE = {"kind": "controller", "path": "/srv/models/sim/r2"}


def _with_model(shipped: Callable[[str], dict[str, Any]], **model: Any) -> dict[str, Any]:
    profile = shipped("sim")
    base = {k: v for k, v in profile["model"].items() if k != "path"}
    profile["model"] = {**base, "served_name": "sim", **model}
    return profile


def test_model_path_alone_stages_nothing(
    shipped: Callable[[str], dict[str, Any]], load: Callable[..., Deployment]
) -> None:
    dep = load(shipped("sim"))
    assert not dep.profile.model.staged
    assert dep.profile.model.path == "/opt/pdstack/models/sim"


def test_a_source_makes_engines_read_the_staged_revision(
    shipped: Callable[[str], dict[str, Any]], load: Callable[..., Deployment]
) -> None:
    profile = _with_model(
        shipped, source=SOURCE, revision="r2", staging={"root": "/data/models", "concurrency": 2}
    )
    dep = load(profile)
    model = dep.profile.model
    assert model.staged and model.path == "/data/models/sim/r2"
    args = render.launch_args(dep.instances[0], dep)
    assert args[args.index("--model-path") + 1] == "/data/models/sim/r2"
    # The same path given explicitly is the same profile.
    assert (
        load(
            _with_model(
                shipped,
                path="/data/models/sim/r2",
                source=SOURCE,
                revision="r2",
                staging={"root": "/data/models"},
            )
        ).profile.model.path
        == model.path
    )


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"source": SOURCE}, "source needs a revision"),
        ({"source": SOURCE, "revision": "r2", "path": "/x"}, "engines read the staged revision"),
        ({"source": {"kind": "staging", "path": "/srv/m"}, "revision": "r2"}, "HOST:/absolute"),
        ({"source": {"kind": "shared", "path": "nfs/m"}, "revision": "r2"}, "absolute path"),
        ({"source": SOURCE, "revision": "../r2"}, "revision"),
        ({"source": SOURCE, "revision": "r2", "served_name": "org/sim"}, "names a directory"),
        ({"source": SOURCE, "revision": "r2", "staging": {"concurrency": 0}}, "concurrency"),
    ],
)
def test_a_bad_source_is_refused_naming_the_key(
    shipped: Callable[[str], dict[str, Any]],
    write_deployment: Callable[..., Path],
    model: dict[str, Any],
    words: str,
) -> None:
    result = run_pdctl("validate", "-i", str(write_deployment(_with_model(shipped, **model))))
    assert result.exit_code == 2
    assert words in result.stderr and "model" in result.stderr


def _stage(root: Path, name: str, rev: str, verified: bool) -> Path:
    d = root / name / rev
    d.mkdir(parents=True)
    (d / "w.safetensors").write_bytes(b"w" * 64)
    manifest.write(d)
    if verified:
        assert manifest.verify(d, mark=True) == []
    return d


def test_staged_revisions_lists_each_revision_and_whether_it_verified(tmp_path: Path) -> None:
    _stage(tmp_path, "sim", "r1", verified=True)
    _stage(tmp_path, "sim", "r2", verified=False)
    (tmp_path / ".incoming").mkdir()
    found = [(s.served_name, s.revision, s.verified) for s in staged_revisions(tmp_path)]
    assert found == [("sim", "r1", True), ("sim", "r2", False)]
    assert staged_revisions(tmp_path / "absent") == []


def test_the_running_revision_comes_from_the_engines_model_path() -> None:
    assert model_path_arg(["python", "-m", "x", "--model-path", "/r/sim/r1", "--port", "1"]) == (
        "/r/sim/r1"
    )
    assert model_path_arg(["--model=/m"]) == "/m"
    assert model_path_arg(["--port", "1"]) is None
    assert running_revision("/r", revision_dir("/r", "sim", "r1")) == ("sim", "r1")
    assert running_revision("/r", "/opt/pdstack/models/sim") is None
    assert running_revision("/r", "/r/sim") is None


class FakeSystemd:
    """A host's units: main PID by unit, command line by PID."""

    def __init__(self, pids: dict[str, int], argv: dict[int, list[str]]) -> None:
        self.pids, self.argv = pids, argv

    def show(self, unit: str) -> UnitStatus:
        return UnitStatus(unit, "loaded", "active", "running", self.pids.get(unit, 0), None, 0)

    def cmdline(self, pid: int) -> list[str]:
        return self.argv[pid]


def test_host_models_pairs_each_revision_with_the_engines_that_run_it(tmp_path: Path) -> None:
    r1 = _stage(tmp_path, "sim", "r1", verified=True)
    _stage(tmp_path, "sim", "r2", verified=False)
    systemd = FakeSystemd(
        {"p.service": 11, "d.service": 12},
        {11: ["py", "--model-path", str(r1)], 12: ["py", "--model-path", "/elsewhere"]},
    )
    units = ["p.service", "d.service", "gone.service"]
    h = model_status.host_models("node-a", str(tmp_path), units, systemd)  # type: ignore[arg-type]
    assert [(e.unit, e.revision) for e in h.engines] == [
        ("p.service", "r1"),
        ("d.service", None),
        ("gone.service", None),
    ]
    assert h.runners(str(r1)) == ["p.service"]
    lines = model_status.table([h])
    assert any("sim/r1" in ln and "verified" in ln and "p.service" in ln for ln in lines)
    assert any("sim/r2" in ln and "partial" in ln for ln in lines)
    assert any("/elsewhere" in ln and "unstaged" in ln for ln in lines)
    assert any("gone.service" in ln and "stopped" in ln for ln in lines)
    assert model_status.from_json(json.loads(json.dumps(model_status.to_json(h)))) == h


def test_the_fleet_lists_every_host_even_one_that_cannot_answer(tmp_path: Path) -> None:
    asked: list[tuple[str, str, list[str]]] = []

    def ask(host: str, address: str, root: str, units: list[str]) -> model_status.HostModels:
        asked.append((host, address, units))
        if host == "node-b":
            raise HostError("node-b: unreachable")
        return model_status.HostModels(host)

    hosts = {"node-b": ("10.0.0.2", ["u2"]), "node-a": ("10.0.0.1", ["u1"])}
    rows = model_status.fleet_models(hosts, "/r", ask)
    errors = [(r.host, r.error) for r in rows]
    assert errors == [("node-a", None), ("node-b", "node-b: unreachable")]
    assert sorted(asked) == [("node-a", "10.0.0.1", ["u1"]), ("node-b", "10.0.0.2", ["u2"])]
    assert any("node-b" in ln and "unreachable" in ln for ln in model_status.table(rows))


def test_the_host_local_form_answers_what_the_fleet_form_reads(tmp_path: Path) -> None:
    """The argv the fleet runs over ssh parses, and its JSON reads back (no units: this
    machine's systemd is not asked)."""
    _stage(tmp_path, "sim", "r1", verified=True)
    argv = model_status.local_argv("node-a", str(tmp_path), [])
    result = run_pdctl(*argv[1:])
    assert result.exit_code == 0, result.stderr
    [h] = [model_status.from_json(doc) for doc in json.loads(result.stdout)]
    assert h.host == "node-a" and [(s.revision, s.verified) for s in h.staged] == [("r1", True)]


@pytest.mark.parametrize(
    ("kind", "path", "where"),
    [
        ("controller", "/srv/m/r2", ["/srv/m/r2/", "root@10.0.0.5:/r/m/r2/"]),
        ("staging", "stage-1:/srv/m/r2", ["stage-1:/srv/m/r2/", "/r/m/r2/"]),
        ("shared", "/nfs/m/r2", ["/nfs/m/r2/", "/r/m/r2/"]),
    ],
)
def test_rsync_resumes_and_runs_where_the_source_is(kind: str, path: str, where: list[str]) -> None:
    argv = staging.rsync_argv(kind, path, "/r/m/r2/", "10.0.0.5", "/tmp/ssh.cfg")
    assert argv[0] == "rsync" and {"--partial", "--append-verify"} <= set(argv)
    assert argv[-2:] == where
    assert ("-e" in argv) == (kind != "shared")
    # Only the controller reaches the host with Ansible's ssh settings (the -F file).
    assert ("-F" in " ".join(argv)) == (kind == "controller")
    one = staging.rsync_argv(kind, path, "/r/in.json", "10.0.0.5", None, manifest.MANIFEST)
    assert one[-2].endswith(f"/r2/{manifest.MANIFEST}")


def test_the_roles_get_the_revision_to_stage_from_the_deployment(
    shipped: Callable[[str], dict[str, Any]], write_deployment: Callable[..., Path]
) -> None:
    """filter_plugins/pdstack.py: stage.yml's facts, and the rsync argv it templates."""
    filters = filter_plugin()
    plain = write_deployment(shipped("sim"))
    assert filters.pdstack_deployment(str(plain), "profile.yml")["model"] == {"staged": False}
    staged = write_deployment(_with_model(shipped, source=SOURCE, revision="r2"))
    model = filters.pdstack_deployment(str(staged), "profile.yml")["model"]
    assert model["dir"] == "/var/lib/pdstack/models/sim/r2"
    assert model["incoming"] == "/var/lib/pdstack/models/.incoming/sim-r2.json"
    assert (model["margin_gib"], model["concurrency"]) == (10.0, 4)
    argv = filters.pdstack_stage_rsync(model, model["dir"] + "/", "10.0.0.5", "/c/ssh")
    assert argv[-2:] == ["/srv/models/sim/r2/", "root@10.0.0.5:/var/lib/pdstack/models/sim/r2/"]
