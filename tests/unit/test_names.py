"""pdctl.names: unit and file names, and reading a pair back from a unit name."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from pdctl import names
from pdctl.spec import Role


def test_roles_are_the_spec_roles() -> None:
    assert tuple(r.value for r in Role) == names.ROLES


@pytest.mark.parametrize("pair", ["pd0", "big-pair", "a-prefill-b"])
def test_pair_read_back_from_every_unit_of_the_pair(pair: str) -> None:
    units = [names.pair_target(pair)] + [names.engine_unit(pair, r) for r in names.ROLES]
    assert [names.pair_of_unit(u) for u in units] == [pair] * 3
    # The role's find patterns catch every one of them.
    assert all(any(fnmatch.fnmatch(u, g) for g in names.PAIR_UNIT_GLOBS) for u in units)


@pytest.mark.parametrize(
    "unit", [names.GATEWAY_UNIT, names.recover_unit("pd0"), "pdstack-pd0.service", "x.target"]
)
def test_other_units_belong_to_no_pair(unit: str) -> None:
    assert names.pair_of_unit(unit) is None


def test_stale_pairs_stop_targets_first_and_remove_every_file() -> None:
    found = [
        "pdstack-pd0-prefill.service",
        "pdstack-pd0-decode.service",
        "pdstack-pd0.target",
        "pdstack-old-decode.service",
        "pdstack-old.target",
        "pdstack-old-prefill.service",
        "pdstack-gone.target",  # a target left without its engines
    ]
    stale = names.stale_pairs(found, keep=["pd0"])
    assert stale["pairs"] == ["old", "gone"]
    assert stale["stop"] == [
        "pdstack-old.target",
        "pdstack-gone.target",
        "pdstack-old-decode.service",
        "pdstack-old-prefill.service",
    ]
    assert stale["files"] == [
        "/etc/systemd/system/pdstack-old.target",
        "/etc/systemd/system/pdstack-old-prefill.service",
        "/etc/systemd/system/pdstack-old-decode.service",
        "/etc/pdstack/old-prefill.env",
        "/etc/pdstack/old-decode.env",
        "/var/lib/pdstack-pending/old.json",
        "/etc/systemd/system/pdstack-gone.target",
        "/etc/systemd/system/pdstack-gone-prefill.service",
        "/etc/systemd/system/pdstack-gone-decode.service",
        "/etc/pdstack/gone-prefill.env",
        "/etc/pdstack/gone-decode.env",
        "/var/lib/pdstack-pending/gone.json",
    ]


def test_nothing_stale_when_every_pair_is_kept() -> None:
    found = [names.pair_target("pd0"), names.engine_unit("pd0", "decode")]
    assert names.stale_pairs(found, keep=["pd0"]) == {"pairs": [], "stop": [], "files": []}


def test_documentation_names_files_the_role_installs() -> None:
    root = Path(__file__).resolve().parents[2]
    assert all((root / doc).is_file() for doc in names.DOCS)
    assert names.documentation().split() == [f"file:///opt/pdstack/{d}" for d in names.DOCS]


def test_every_unit_starts_with_the_prefix_preflight_allows() -> None:
    units = [
        names.engine_unit("pd0", "decode"),
        names.pair_target("pd0"),
        names.recover_unit("pd0"),
        names.GATEWAY_UNIT,
        names.GATEWAY_LEASE_UNIT,
        names.ETCD_UNIT,
    ]
    assert all(u.startswith(f"{names.PREFIX}-") for u in units)
