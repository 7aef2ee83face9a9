"""`pdctl validate --target-version`: the profile's launch flags against the target SGLang's
parser, the monitoring pack against the families it emits (pdctl/lint/target.py), and the
shipped metric lists against what scripts/sglang-metrics.py reads from SGLang's source."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdctl import exits
from pdctl.lint import Finding, Severity
from pdctl.lint.target import NoTargetList, check_target, known_families
from pdctl.spec import Deployment
from tests.conftest import CACHE, ROOT, require_path
from tests.unit.test_lint import edit

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]
SGLANG_SITE = CACHE / "sglang-parser" / "lib" / "python3.11" / "site-packages"
# Families the pinned 0.5.23 emits and 0.5.17 does not (pdctl/data/sglang-*-metrics.txt).
NEW_IN_0_5_23 = "sglang:decode_deferred_kv_release_total"
QUEUE_NEW_IN_0_5_23 = "sglang:num_decode_host_receive_queue_reqs"


def _by_id(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def _on_0_5_17(shipped: Shipped, edits: dict[str, Any]) -> dict[str, Any]:
    return edit(shipped("reference"), {"versions.sglang": "0.5.17", **edits})


def write_pack(root: Path, rules: dict[str, str], panels: dict[str, str]) -> Path:
    """A pack as `python -m monitoring.build --out DIR` writes it: rules/ and dashboards/."""
    group = {"name": "g", "rules": [{"record": n, "expr": e} for n, e in rules.items()]}
    (root / "rules").mkdir(parents=True)
    (root / "rules" / "pdstack.rules.yml").write_text(yaml.safe_dump({"groups": [group]}))
    # One row holding the panels, as Grafana nests a collapsed row's panels.
    row = {"type": "row", "title": "r", "panels": [
        {"type": "timeseries", "title": t, "targets": [{"expr": e}]} for t, e in panels.items()
    ]}  # fmt: skip
    (root / "dashboards").mkdir()
    (root / "dashboards" / "b.json").write_text(json.dumps({"uid": "board", "panels": [row]}))
    return root


def test_flag_removed_in_target_is_refused_naming_version_and_closest(
    load: Load, shipped: Shipped
) -> None:
    # 0.5.17's --nsa-decode-backend is 0.5.23's --dsa-decode-backend.
    dep = load(_on_0_5_17(shipped, {"engine.decode.extra_args": ["--nsa-decode-backend", "x"]}))
    (finding,) = _by_id(check_target(dep, "0.5.23", ROOT / "monitoring"))["target-flag-refused"]
    assert finding.severity is Severity.ERROR
    assert finding.where == "gpu-node-1/pd0-decode"
    assert "sglang 0.5.23 does not accept --nsa-decode-backend" in finding.message
    assert "(sglang 0.5.17 takes it: removed or renamed)" in finding.message
    assert "did you mean --dsa-decode-backend" in finding.message
    assert finding.fix.startswith("engine.decode.extra_args: remove or rename")
    # The same profile moving to the version it runs is clean.
    assert "target-flag-refused" not in _by_id(check_target(dep, "0.5.17", ROOT / "monitoring"))


def test_flag_that_becomes_ambiguous_in_target_is_refused(load: Load, shipped: Shipped) -> None:
    # 0.5.17 has --cuda-graph-max-bs itself; 0.5.23 only the per-phase options it abbreviates.
    dep = load(_on_0_5_17(shipped, {"engine.decode.extra_args": ["--cuda-graph-max-bs", "8"]}))
    (finding,) = _by_id(check_target(dep, "0.5.23", ROOT / "monitoring"))["target-flag-refused"]
    assert "--cuda-graph-max-bs is ambiguous in sglang 0.5.23" in finding.message
    assert "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in finding.message


def test_flag_unknown_to_both_versions_is_not_called_renamed(load: Load, shipped: Shipped) -> None:
    dep = load(edit(shipped("reference"), {"engine.common.extra_args": ["--trust-remote-codes"]}))
    (finding,) = _by_id(check_target(dep, "0.5.17", ROOT / "monitoring"))["target-flag-refused"]
    assert "takes it" not in finding.message
    assert finding.where == "gpu-node-1/pd0-prefill, gpu-node-1/pd0-decode"


def test_pinned_profile_and_committed_pack_are_clean_on_the_pinned_version(
    load: Load, shipped: Shipped
) -> None:
    assert check_target(load(shipped("reference")), "0.5.23", ROOT / "monitoring") == []


def test_pack_reading_families_the_target_lacks_is_named(
    load: Load, shipped: Shipped, tmp_path: Path
) -> None:
    pack = write_pack(
        tmp_path / "pack",
        rules={
            "r:gone:rate": f"sum(rate({NEW_IN_0_5_23}[5m]))",
            # A regex that still selects some queue gauges reads those that exist.
            "r:queues:sum": 'sum({__name__=~"sglang:num_.*_queue_reqs"})',
            "r:deferred:any": 'count({__name__=~"sglang:decode_deferred_kv_release_.*"})',
        },
        panels={"Host-receive queue": QUEUE_NEW_IN_0_5_23, "Running": "sglang:num_running_reqs"},
    )
    dep = load(shipped("reference"))
    found = _by_id(check_target(dep, "0.5.17", pack))
    rules = {f.where: f for f in found["target-rule-metric-missing"]}
    assert set(rules) == {"pdstack.rules.yml: r:gone:rate", "pdstack.rules.yml: r:deferred:any"}
    gone = rules["pdstack.rules.yml: r:gone:rate"]
    assert gone.severity is Severity.ERROR
    assert f"sglang 0.5.17 does not emit {NEW_IN_0_5_23} (sglang 0.5.23 does)" in gone.message
    regex = rules["pdstack.rules.yml: r:deferred:any"]
    assert '{__name__=~"sglang:decode_deferred_kv_release_.*"}' in regex.message
    (panel,) = found["target-dashboard-metric-missing"]
    assert panel.severity is Severity.WARNING
    assert panel.where == "board: Host-receive queue"
    assert QUEUE_NEW_IN_0_5_23 in panel.message
    assert check_target(dep, "0.5.23", pack) == []


def test_missing_pack_is_a_warning_not_a_pass(load: Load, shipped: Shipped, tmp_path: Path) -> None:
    (finding,) = check_target(load(shipped("reference")), "0.5.23", tmp_path / "absent")
    assert (finding.id, finding.severity) == ("target-monitoring-unchecked", Severity.WARNING)
    assert str(tmp_path / "absent") in finding.message


def test_target_without_lists_is_refused_before_any_check(
    load: Load, shipped: Shipped, monkeypatch: pytest.MonkeyPatch
) -> None:
    dep = load(shipped("reference"))
    with pytest.raises(NoTargetList, match=r"no flag and metric lists for sglang 0\.5\.99 "):
        check_target(dep, "0.5.99", ROOT / "monitoring")
    # A flag list alone is not enough: the pack could not be checked.
    monkeypatch.setattr("pdctl.lint.target.known_families", lambda _v: None)
    with pytest.raises(NoTargetList, match=r"\(it has 0\.5\.17, 0\.5\.23\)"):
        check_target(dep, "0.5.23", ROOT / "monitoring")


def test_cli_bad_target_is_one_line_and_changes_nothing(
    pdctl: Callable[..., Any], write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    inventory = write_deployment(shipped("reference"))
    before = {p: p.read_bytes() for p in inventory.parent.iterdir()}
    run = pdctl("validate", "-i", str(inventory), "--target-version", "0.5.99")
    assert run.exit_code == exits.BAD_INPUT
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("Error: pdctl has no flag and metric lists for sglang 0.5.99")
    assert {p: p.read_bytes() for p in inventory.parent.iterdir()} == before


def test_cli_refuses_a_removed_flag_with_the_lint_exit_code(
    pdctl: Callable[..., Any], write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    profile = _on_0_5_17(shipped, {"engine.decode.extra_args": ["--nsa-decode-backend", "x"]})
    inventory = write_deployment(profile)
    assert pdctl("validate", "-i", str(inventory)).exit_code == exits.OK
    pack = ["--monitoring", str(ROOT / "monitoring")]
    run = pdctl(
        "validate", "-i", str(inventory), *pack, "--target-version", "0.5.23", "--format", "json"
    )
    assert run.exit_code == exits.BAD_INPUT
    out = json.loads(run.stdout)
    assert out["target_version"] == "0.5.23"
    assert [f["id"] for f in out["findings"]] == ["target-flag-refused"]


# Pack files that are no rules file or dashboard, and what the one line says of each.
BROKEN_PACK_FILES = {
    "malformed rules YAML": ("rules/pdstack.rules.yml", "groups: [\n", "malformed YAML"),
    "rules without expr": (
        "rules/pdstack.rules.yml",
        "groups: [{name: g, rules: [{record: r}]}]\n",
        "not a Prometheus rules file",
    ),
    "rules not a mapping": ("rules/pdstack.rules.yml", "- 1\n- 2\n", "not a Prometheus rules"),
    "dashboard not JSON": ("dashboards/b.json", "{", "not JSON (Expecting"),
    "dashboard not UTF-8": ("dashboards/b.json", b"\xff\xfe{}", "not JSON ("),
    "dashboard a list": ("dashboards/b.json", "[1]", "not a Grafana dashboard"),
}


def _broken_pack(root: Path, name: str) -> tuple[Path, Path, str]:
    """A pack with one file broken as BROKEN_PACK_FILES[name] says: (pack, that file, its
    one line's words)."""
    rel, text, words = BROKEN_PACK_FILES[name]
    pack = write_pack(root, {"r:ok": "sum(sglang:num_running_reqs)"}, {"Running": "up"})
    broken = pack / rel
    if isinstance(text, bytes):
        broken.write_bytes(text)
    else:
        broken.write_text(text)
    return pack, broken, words


@pytest.mark.parametrize("name", BROKEN_PACK_FILES)
def test_cli_broken_pack_file_is_one_line_naming_it(
    name: str,
    pdctl: Callable[..., Any],
    write_deployment: Callable[..., Path],
    shipped: Shipped,
    tmp_path: Path,
) -> None:
    inventory = write_deployment(shipped("reference"))
    pack, broken, words = _broken_pack(tmp_path / "pack", name)
    run = pdctl(
        "validate", "-i", str(inventory), "--target-version", "0.5.23", "--monitoring", str(pack)
    )
    assert run.exit_code == exits.BAD_INPUT
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"Error: {broken}: ")
    assert words in line


def test_cli_monitoring_without_target_version_is_refused(
    pdctl: Callable[..., Any], write_deployment: Callable[..., Path], shipped: Shipped
) -> None:
    """Refused, not ignored: the pack named would otherwise go unchecked without a word."""
    inventory = write_deployment(shipped("reference"))
    run = pdctl("validate", "-i", str(inventory), "--monitoring", str(ROOT / "monitoring"))
    assert run.exit_code == exits.BAD_INPUT
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("Error: --monitoring names the pack --target-version checks")
    # The default pack is what --target-version alone checks; no --monitoring, no refusal.
    assert pdctl("validate", "-i", str(inventory), "--target-version", "0.5.23").exit_code == 0


@pytest.mark.parametrize("unreadable", ["inventory", "profile", "pack", "monitoring alone"])
def test_cli_unreadable_input_with_format_json_is_a_json_error(
    unreadable: str,
    pdctl: Callable[..., Any],
    write_deployment: Callable[..., Path],
    shipped: Shipped,
    tmp_path: Path,
) -> None:
    """stdout stays JSON for scripts whatever failed: an object with the error's one line and
    the exit code, the sources it was given, and nothing on stderr."""
    inventory = write_deployment(shipped("reference"))
    args = ["validate", "-i", str(inventory), "--format", "json"]
    expected = {
        "inventory": f"{inventory}: inventory not found",
        "profile": "malformed YAML",
        "pack": "malformed YAML",
        "monitoring alone": "--monitoring names the pack",
    }[unreadable]
    if unreadable == "inventory":
        inventory.unlink()
    elif unreadable == "profile":
        (inventory.parent / "profile.yml").write_text("engine: [\n")
    elif unreadable == "pack":
        pack, _, _ = _broken_pack(tmp_path / "pack", "malformed rules YAML")
        args += ["--target-version", "0.5.23", "--monitoring", str(pack)]
    else:
        args += ["--monitoring", str(ROOT / "monitoring")]
    run = pdctl(*args)
    assert run.exit_code == exits.BAD_INPUT
    assert run.stderr == ""
    out = json.loads(run.stdout)
    assert expected in out["error"] and "\n" not in out["error"]
    assert out["exit_code"] == exits.BAD_INPUT
    assert out["inventory"] == str(inventory)
    assert out["target_version"] == ("0.5.23" if unreadable == "pack" else None)


def test_static_metric_list_holds_every_family_the_collectors_create() -> None:
    """scripts/sglang-metrics.py reads the source; tests/data/sglang_0.5.23_metrics.txt comes
    from instantiating SGLang's collectors: every family of the latter, with its type, is in
    the former (which also holds families of collectors that table does not instantiate)."""
    created = {}
    for line in (ROOT / "tests" / "data" / "sglang_0.5.23_metrics.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()[:2]
            created[name] = kind
    listed = known_families("0.5.23") or {}
    assert {n: listed.get(n) for n in created} == created


@pytest.mark.parser
def test_metric_list_matches_the_installed_sglang() -> None:
    """The committed list is what scripts/sglang-metrics.py prints from the pinned SGLang."""
    package = require_path(SGLANG_SITE / "sglang", "SGLang parser environment")
    script = ROOT / "scripts" / "sglang-metrics.py"
    out = subprocess.check_output([sys.executable, script, package], text=True, timeout=300)
    version = out.split()[4]  # "# Prometheus families sglang <version> …"
    assert version == "0.5.23"
    assert out == (ROOT / "pdctl" / "data" / f"sglang-{version}-metrics.txt").read_text()
