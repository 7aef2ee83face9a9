"""A rollout's waves, and a group's release as its units' drop-ins (pdctl.ops.release)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from pdctl.errors import PdctlError
from pdctl.ops import release
from pdctl.ops import rollout as ro
from pdctl.ops.context import Ops
from pdctl.ops.release import Release
from pdctl.ops.systemd import Systemctl
from pdctl.testing.localproc import LocalPair, LocalUnits
from pdctl.testing.stack import SimProc
from tests.unit.ops_fakes import FakeGateway, FakeSystemd, fake_ops, topo

NEW = Release(env="/opt/pdstack/envs/sglang-0.5.24-9f3e1c2a", model="/var/lib/models/rev-2")


def _fleet() -> tuple[dict[str, FakeSystemd], Ops]:
    hosts = {h: FakeSystemd() for h in ("node-a", "node-b")}
    ops = dataclasses.replace(
        fake_ops(FakeSystemd(), FakeGateway(), t=topo(tuple(hosts), ("pd0", "pd1", "pd2"))),
        systemd_for=hosts.__getitem__,
    )
    return hosts, ops


def test_waves_take_k_groups_in_the_rolls_order_host_by_host() -> None:
    _, ops = _fleet()
    pairs = ops.source.pairs()
    shuffled = [pairs[4], pairs[0], pairs[5], pairs[2], pairs[1], pairs[3]]
    assert ro.waves(ops, shuffled, 2) == [
        ["node-a/pd0", "node-a/pd2"],
        ["node-a/pd1", "node-b/pd1"],
        ["node-b/pd2", "node-b/pd0"],  # within a host, in the order given
    ]
    assert ro.waves(ops, pairs, 4) == [
        [p.id for p in pairs[:4]],
        [p.id for p in pairs[4:]],
    ]


def test_a_release_drop_in_reads_back_as_written() -> None:
    text = release.text(NEW)
    assert text.splitlines()[1:] == [
        "[Service]",
        "Environment=PDSTACK_ENV=/opt/pdstack/envs/sglang-0.5.24-9f3e1c2a",
        "Environment=PDSTACK_MODEL_PATH=/var/lib/models/rev-2",
    ]
    assert release.parse(text, "x") == NEW
    env_only = Release(env=NEW.env)
    assert release.parse(release.text(env_only), "x") == env_only


def test_a_drop_in_pdctl_did_not_write_is_named_not_guessed() -> None:
    with pytest.raises(PdctlError, match=r"^node-a:/etc/x sets no PDSTACK_ENV"):
        release.parse("[Service]\nEnvironment=FOO=1\n", "node-a:/etc/x")
    with pytest.raises(ValidationError):
        Release(env="envs/relative")


def test_writing_a_release_writes_each_members_drop_in_then_reloads_each_host_once() -> None:
    hosts, ops = _fleet()
    pair = ops.source.pairs()[0]
    release.write(ops, pair, NEW, decode_first=True)
    a = hosts["node-a"]
    assert list(a.files) == [
        "/etc/systemd/system/pdstack-pd0-decode.service.d/release.conf",
        "/etc/systemd/system/pdstack-pd0-prefill.service.d/release.conf",
    ]
    assert a.jobs == [("daemon-reload", ())] and hosts["node-b"].jobs == []
    assert release.of_group(ops, pair) == NEW
    release.write(ops, pair, None)
    assert a.files == {} and release.of_group(ops, pair) is None


def test_a_group_whose_members_start_different_releases_is_refused() -> None:
    hosts, ops = _fleet()
    pair = ops.source.pairs()[0]
    hosts["node-a"].files[release.dropin(pair.decodes[0].unit)] = release.text(NEW)
    with pytest.raises(PdctlError, match=r"node-a/pd0: its members start with different"):
        release.of_group(ops, pair)


def test_units_that_name_their_environment_in_exec_start_are_refused() -> None:
    """The units site.yml writes (the host's venv in ExecStart=) ignore a release drop-in: a
    rollout of them would restart groups onto what they ran and gate a release against
    itself."""
    hosts, ops = _fleet()
    pairs = ops.source.pairs()[:2]
    reads = "ExecStart=/usr/bin/numactl ${PDSTACK_ENV}/bin/python -m sglang.launch_server\n"
    for inst in (i for p in pairs for i in p.instances):
        hosts[inst.host].files[f"/etc/systemd/system/{inst.unit}"] = reads
    ro.check_units_read_release(ops, pairs)  # every unit reads it: nothing to say
    deaf = pairs[0].decodes[0]
    path = f"/etc/systemd/system/{deaf.unit}"
    hosts[deaf.host].files[path] = "ExecStart=/opt/pdstack/envs/sglang-0.5.23-1a2b/bin/python\n"
    with pytest.raises(PdctlError, match=rf"^{deaf.host}:{deaf.unit} name their environment"):
        ro.check_units_read_release(ops, pairs)
    assert all(not f.endswith("release.conf") for h in hosts.values() for f in h.files)


def test_local_write_file_makes_its_folder_and_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "unit.service.d" / "release.conf"
    sd = Systemctl("here")
    sd.write_file(str(path), "one\n")
    sd.write_file(str(path), "two\n")
    assert sd.read_file(str(path)) == "two\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["release.conf"]  # no .tmp left


def test_local_units_start_what_the_release_drop_in_says_after_a_reload(tmp_path: Path) -> None:
    """The rehearsal's systemd (pdctl.testing.localproc): a release's environment stands for
    its settings, applied at daemon-reload as systemd applies a drop-in; none: the unit's own."""
    sims = [SimProc.create(m, tmp_path, {"PDSIM_SEED": "1"}) for m in ("prefill", "decode")]
    units = LocalUnits([LocalPair("pd0", *sims)])
    units.environments[NEW.env] = {"PDSIM_TIME_SCALE": "1.5"}
    unit = "pdstack-pd0-decode.service"
    units.write_file(release.dropin(unit), release.text(NEW))
    assert sims[1].env.get("PDSTACK_ENV") is None  # not before the reload
    units.daemon_reload()
    assert sims[1].env["PDSTACK_ENV"] == NEW.env and sims[1].env["PDSIM_TIME_SCALE"] == "1.5"
    assert sims[1].env["PDSTACK_MODEL_PATH"] == NEW.model and sims[1].env["PDSIM_SEED"] == "1"
    assert "PDSTACK_ENV" not in sims[0].env  # the prefill's drop-in was not written
    units.remove_file(release.dropin(unit))
    units.daemon_reload()
    assert "PDSTACK_ENV" not in sims[1].env and "PDSIM_TIME_SCALE" not in sims[1].env
