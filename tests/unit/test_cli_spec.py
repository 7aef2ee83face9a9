"""`pdctl validate` and `pdctl plan` through the real entry point: output, exit codes, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
Shipped = Callable[[str], dict[str, Any]]
Write = Callable[..., Path]
Pdctl = Callable[..., Any]


def _with(profile: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    profile["engine"].setdefault(section, {}).update(values)
    return profile


@pytest.mark.parametrize("name", ["reference", "sim", "sim-fleet"])
def test_shipped_profiles_validate_clean(name: str, pdctl: Pdctl) -> None:
    inventory, profile = ROOT / "inventory.ini", ROOT / f"deploy/profiles/{name}.yml"
    run = pdctl("validate", "--strict", "-i", str(inventory), "-p", str(profile))
    assert run.exit_code == 0, run.stdout + run.stderr
    assert run.stdout.startswith("OK: no findings")


def test_warnings_pass_unless_strict(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    inventory = write_deployment(_with(shipped("reference"), "common", mem_fraction_static=0.61))
    run = pdctl("validate", "-i", str(inventory))
    assert run.exit_code == 0
    assert "memory-tight" in run.stdout and "errors: 0, warnings: 1" in run.stdout
    assert pdctl("validate", "--strict", "-i", str(inventory)).exit_code == 1


def test_errors_exit_2_with_table(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(_with(shipped("reference"), "decode", max_running_requests=128))
    run = pdctl("validate", "-i", str(inventory))
    assert run.exit_code == 2
    for text in ("decode-eager-fallback", "error", "gpu-node-1/pd0-decode", "errors: 1"):
        assert text in run.stdout
    assert "engine.decode.max_running_requests" in run.stdout


def test_validate_json(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    profile = _with(shipped("reference"), "decode", max_running_requests=128)
    _with(profile, "common", mem_fraction_static=0.61)
    run = pdctl("validate", "--format", "json", "-i", str(write_deployment(profile)))
    assert run.exit_code == 2
    out = json.loads(run.stdout)
    assert {f["id"] for f in out["findings"]} == {"decode-eager-fallback", "memory-tight"}
    assert set(out["findings"][0]) == {"id", "severity", "where", "message", "fix"}
    assert out["summary"] == {
        "errors": 1, "warnings": 1, "instances": 2, "hosts": 1, "exit_code": 2,
    }  # fmt: skip


def test_validate_two_hosts(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(shipped("reference"), hosts=["gpu-node-1", "gpu-node-2"])
    run = pdctl("validate", "--format", "json", "-i", str(inventory))
    assert run.exit_code == 0
    assert json.loads(run.stdout)["summary"]["instances"] == 4


def test_plan_reference(pdctl: Pdctl) -> None:
    run = pdctl("plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd0-decode")
    assert run.exit_code == 0, run.stderr
    for text in ("gpu-node-1/pd0-decode", "CUDA graphs (96 x 0.3)", "28.8", "1.94", "fits"):
        assert text in run.stdout
    assert "pd0-prefill" not in run.stdout


def test_plan_what_if_reproduces_the_seed_oom(pdctl: Pdctl) -> None:
    args = ["plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd0-decode"]
    run = pdctl(*args, "--mem-fraction", "0.85", "--graph-max-bs", "32")
    assert run.exit_code == 2
    assert "oom-at-graph-capture" in run.stdout
    assert pdctl(*args, "--mem-fraction", "0.70", "--graph-max-bs", "32").exit_code == 0


def test_plan_json(pdctl: Pdctl) -> None:
    run = pdctl("plan", "--format", "json", "-i", str(ROOT / "inventory.ini"), "--gpu-memory-mib",
                "49152", "--weights-gib", "20", "--kv-bytes-per-token", "8000")  # fmt: skip
    out = json.loads(run.stdout)
    decode = next(i for i in out["instances"] if i["id"] == "gpu-node-1/pd0-decode")
    assert decode["gpu"]["gpu_gib"] == 48 and decode["gpu"]["weights_gib"] == 20
    assert decode["budget"]["verdict"] == "oom-at-graph-capture" and run.exit_code == 2
    assert decode["max_safe_fraction"] is None and decode["max_safe_graph_bs"] == 35


def test_plan_unset_fraction(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    profile = shipped("reference")
    del profile["engine"]["common"]["mem_fraction_static"]
    run = pdctl("plan", "-i", str(write_deployment(profile)), "--instance", "pd0-decode")
    assert run.exit_code == 0
    assert "mem_fraction_static unset" in run.stdout and "0.6" in run.stdout


def test_unknown_instance(pdctl: Pdctl) -> None:
    run = pdctl("plan", "-i", str(ROOT / "inventory.ini"), "--instance", "pd9-decode")
    assert run.exit_code == 2 and "unknown instance pd9-decode" in run.stderr


def test_help_teaches_exit_codes() -> None:
    from click.testing import CliRunner

    from pdctl.cli import cli

    for command in ("validate", "plan"):
        out = CliRunner().invoke(cli, [command, "--help"]).output
        assert "Exit codes" in out and "Examples" in out


def _reference_text() -> str:
    return (ROOT / "deploy/profiles/reference.yml").read_text()


BAD_PROFILES = {
    "malformed YAML": (
        lambda: _reference_text().replace("  policy: round_robin", "  policy: [round_robin"),
        "malformed YAML",
    ),
    "unknown key": (
        lambda: _reference_text().replace("  context_length: 8192", "  context_lenght: 8192"),
        "engine.common.context_lenght: unknown key",
    ),
    "missing key": (
        lambda: _reference_text().replace("  kv_bytes_per_token: 15900\n", ""),
        "model.kv_bytes_per_token: required key is missing",
    ),
    "wrong type": (
        lambda: _reference_text().replace("max_running_requests: 96", "max_running_requests: lots"),
        "engine.decode.max_running_requests: input should be a valid integer",
    ),
    "duplicate pair name": (
        lambda: yaml.safe_dump(
            _pairs(yaml.safe_load(_reference_text()), ["pd0", "pd0"]), sort_keys=False
        ),
        "layout.pairs: duplicate pair name 'pd0'",
    ),
    "duplicate YAML key": (
        lambda: _reference_text().replace("  port: 8000\n", "  port: 8000\n  port: 8001\n"),
        "duplicate key 'port'",
    ),
}


def _pairs(profile: dict[str, Any], names: list[str]) -> dict[str, Any]:
    pair = profile["layout"]["pairs"][0]
    profile["layout"]["pairs"] = [{**pair, "name": n} for n in names]
    return profile


@pytest.mark.parametrize("case", BAD_PROFILES, ids=str)
def test_bad_profile(case: str, pdctl: Pdctl, write_deployment: Write) -> None:
    make, expected = BAD_PROFILES[case]
    inventory = write_deployment(make())
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), expected)


def _assert_one_error(run: Any, file: str, expected: str) -> None:
    assert run.exit_code == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"Error: {file}: ")
    assert expected in lines[0]


def test_empty_inventory_group(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(shipped("reference"))
    inventory.write_text(inventory.read_text().replace("[router]\ngpu-node-1", "[router]"))
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory), "[router]: group has no hosts")


def test_profile_host_missing_from_inventory(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    profile = shipped("reference")
    profile["hosts"] = {"gpu-node-9": {"hardware": profile["hardware"]}}
    inventory = write_deployment(profile)
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(
        run, str(inventory.parent / "profile.yml"), "hosts.gpu-node-9: host is not in the inventory"
    )


def test_missing_inventory(pdctl: Pdctl, tmp_path: Path) -> None:
    run = pdctl("validate", "-i", str(tmp_path / "nope.ini"))
    _assert_one_error(run, str(tmp_path / "nope.ini"), "inventory not found")


# ----- hostile input: refused at load, before anything is rendered or written ---------------
def _set(profile: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node: Any = profile
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[last] = value
    return profile


ENV = "engine.common.env"
ARGS = "engine.common.extra_args"
HOSTILE_PROFILES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    # id: (base profile, {dotted path: value}, key path in the error, text in the error)
    "newline in env value": (
        "reference", {f"{ENV}.NCCL_ALGO": "Ring\nLD_PRELOAD=/tmp/evil.so"},
        f"{ENV}.NCCL_ALGO", "control character U+000A (newline) is not allowed",
    ),
    "newline in served_name": (
        "reference", {"model.served_name": "m\nExecStartPre=/bin/sh"},
        "model.served_name", "U+000A (newline)",
    ),
    "newline in model.path": (
        "reference", {"model.path": "/models/m\n[Service]"}, "model.path", "U+000A (newline)",
    ),
    "carriage return in sim value": (
        "sim", {"sim.PDSIM_DEGRADED_MODE": "fail\rx"}, "sim.PDSIM_DEGRADED_MODE",
        "U+000D (carriage return)",
    ),
    "NUL in extra_args": (
        "reference", {ARGS: ["--trust-remote-code\0"]}, f"{ARGS}[0]", "U+0000 (nul)",
    ),
    "bidi override in served_name": (
        "reference", {"model.served_name": "abc\u202edef"}, "model.served_name",
        "U+202E (right-to-left override)",
    ),
    "tab in an env key": (
        "reference", {f"{ENV}.NCCL\tALGO": "Ring"}, f"{ENV}['NCCL\\tALGO']", "in this key",
    ),
    "extra_args joined flags": (
        "reference", {ARGS: ["--trust-remote-code", "--max-total-tokens=1 --disable-radix-cache"]},
        f"{ARGS}[1]", "holds whitespace: each element is one flag (--name or --name=value)",
    ),
    "extra_args shell command": (
        "reference", {ARGS: ["--trust-remote-code", "--tool-call-parser", "; rm -rf /"]},
        f"{ARGS}[2]", "holds whitespace, ';'",
    ),
    "extra_args command substitution": (
        "reference", {"router.extra_args": ["--api-key=$(cat /etc/shadow)"]},
        "router.extra_args[0]", "'$', '(', ')'",
    ),
    "extra_args single-dash flag": (
        "reference", {ARGS: ["-x"]}, f"{ARGS}[0]", "'-x' is not a flag",
    ),
    "extra_args value without flag": (
        "reference", {ARGS: ["true"]}, ARGS, "'true' is a value with no flag before it",
    ),
    "env key with a space": (
        "reference", {f"{ENV}.NCCL ALGO": "Ring"}, f"{ENV}['NCCL ALGO']",
        "is not an environment variable name: letters, digits and _",
    ),
    "CUDA_VISIBLE_DEVICES in env": (
        "reference", {"engine.decode.env.CUDA_VISIBLE_DEVICES": "0"},
        "engine.decode.env.CUDA_VISIBLE_DEVICES",
        "pdstack sets CUDA_VISIBLE_DEVICES itself: set layout.pairs[].prefill.gpus and "
        "layout.pairs[].decode.gpus",
    ),
    "PYTHONUNBUFFERED in env": (
        "reference", {f"{ENV}.PYTHONUNBUFFERED": "0"}, f"{ENV}.PYTHONUNBUFFERED",
        "pdstack sets PYTHONUNBUFFERED itself: remove it",
    ),
    "derived sim knob in env": (
        "sim", {f"{ENV}.PDSIM_WEIGHTS_GIB": "1"}, f"{ENV}.PDSIM_WEIGHTS_GIB",
        "set model.weights_gib_per_gpu, or sim.PDSIM_WEIGHTS_GIB",
    ),
    "sim key without PDSIM_": (
        "sim", {"sim.LD_PRELOAD": "/tmp/x.so"}, "sim.LD_PRELOAD", "sim keys are PDSIM_*",
    ),
    "router host with a flag": (
        "reference", {"router.host": "0.0.0.0 --log-level debug"}, "router.host",
        "is not an IPv4 address or DNS name",
    ),
    "negative GPU": (
        "reference", {"layout.pairs.0.decode.gpus": [-1, 5, 6, 7]},
        "layout.pairs[0].decode.gpus[0]", "greater than or equal to 0",
    ),
    "negative GPU in numa_gpus": (
        "reference", {"hardware.numa_gpus": {0: [0, 1, 2, 3], 1: [4, 5, 6, -7]}},
        "hardware.numa_gpus[1][3]", "greater than or equal to 0",
    ),
    "context over native": (
        "reference", {"model.native_context_length": 4096}, "engine.common.context_length",
        "8192 is above model.native_context_length (4096): SGLang refuses it at start-up; "
        "allowed: at most 4096, or also set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
    ),
    "context over native, override off": (
        "reference", {"model.native_context_length": 4096,
                      "engine.decode.env.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "0"},
        "engine.common.context_length", "above model.native_context_length",
    ),
    "model path read as a flag": (
        "reference", {"model.path": "--help"}, "model.path", "starts with '-'",
    ),
    "version with pip options": (
        "reference", {"versions.sglang": "0.5.23 --index-url http://evil"}, "versions.sglang",
        "should match pattern",
    ),
    "kv_cache_dtype with two words": (
        "reference", {"engine.common.kv_cache_dtype": "fp8 --x"},
        "engine.common.kv_cache_dtype", "should match pattern",
    ),
}  # fmt: skip


def _assert_refused(run: Any, file: str, key: str, expected: str) -> None:
    _assert_one_error(run, file, expected)
    assert run.stderr.startswith(f"Error: {file}: {key}: "), run.stderr


@pytest.mark.parametrize("case", HOSTILE_PROFILES, ids=str)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_hostile_profile_refused(
    case: str, command: str, pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    base, edits, key, expected = HOSTILE_PROFILES[case]
    profile = shipped(base)
    for path, value in edits.items():
        _set(profile, path, value)
    inventory = write_deployment(profile)
    before = sorted(inventory.parent.iterdir())
    run = pdctl(command, "-i", str(inventory))
    _assert_refused(run, str(inventory.parent / "profile.yml"), key, expected)
    assert sorted(inventory.parent.iterdir()) == before


def test_hostile_profile_stops_site_yml(write_deployment: Write, shipped: Shipped) -> None:
    """The roles load through the filter plugin: the same refusal fails the play before any
    template task writes a file."""
    from ansible.errors import AnsibleFilterError

    from tests.unit.test_ansible_filter import filters

    profile = _set(shipped("reference"), f"{ENV}.CUDA_VISIBLE_DEVICES", "0")
    inventory = write_deployment(profile)
    with pytest.raises(AnsibleFilterError, match=f"{ENV}.CUDA_VISIBLE_DEVICES: pdstack sets"):
        filters.pdstack_deployment(str(inventory), "profile.yml")


def test_context_over_native_with_override_is_a_warning(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    profile = _set(shipped("reference"), "model.native_context_length", 4096)
    _set(profile, f"{ENV}.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    run = pdctl("validate", "--format", "json", "-i", str(write_deployment(profile)))
    assert run.exit_code == 0, run.stderr
    (finding,) = json.loads(run.stdout)["findings"]
    assert finding["id"] == "context-over-native" and finding["severity"] == "warning"
    assert finding["fix"].startswith("engine.common.context_length: at most 4096")


@pytest.mark.parametrize(
    ("host_line", "key", "expected"),
    [
        ('gpu-node-1 ansible_host="10.0.0.5 --disable-cuda-graph"', "gpu-node-1.ansible_host",
         "'10.0.0.5 --disable-cuda-graph' is not an IPv4 address or DNS name"),
        ("gpu-node-1 ansible_host=--help", "gpu-node-1.ansible_host", "not an IPv4 address"),
        ("gpu-node-1 ansible_host=10.0.0.999", "gpu-node-1.ansible_host", "not an IPv4 address"),
        ("gpu-node-1 ansible_host=fe80::1", "gpu-node-1.ansible_host", "IPv6 is not supported"),
    ],
)  # fmt: skip
def test_hostile_inventory_refused(
    host_line: str, key: str, expected: str, pdctl: Pdctl, write_deployment: Write,
    shipped: Shipped,
) -> None:  # fmt: skip
    inventory = write_deployment(shipped("reference"))
    inventory.write_text(inventory.read_text().replace("gpu-node-1\n", f"{host_line}\n", 1))
    run = pdctl("render", "-i", str(inventory))
    _assert_refused(run, str(inventory), key, expected)


def test_inventory_host_name_must_be_a_host_name(pdctl: Pdctl, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    profile = ROOT / "deploy" / "profiles" / "reference.yml"
    inventory.write_text(
        "all:\n  vars:\n    pdstack_profile: " + str(profile) + "\n  children:\n"
        "    pd_hosts:\n      hosts:\n        'gpu node;1': {ansible_host: 10.0.0.1}\n"
        "    router:\n      hosts:\n        'gpu node;1': {}\n"
    )
    run = pdctl("validate", "-i", str(inventory))
    _assert_refused(run, str(inventory), "gpu node;1", "inventory host name: 'gpu node;1' is not")


def test_accepted_hosts(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    for address in ("10.0.0.5", "gpu-1.example.com", "node_a"):
        inventory = write_deployment(shipped("reference"))
        inventory.write_text(
            inventory.read_text().replace("gpu-node-1\n", f"gpu-node-1 ansible_host={address}\n", 1)
        )
        run = pdctl("validate", "-i", str(inventory))
        assert run.exit_code == 0, (address, run.stderr)


def test_binary_profile(pdctl: Pdctl, write_deployment: Write, shipped: Shipped) -> None:
    inventory = write_deployment(shipped("reference"))
    (inventory.parent / "profile.yml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 64)
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), "not UTF-8 text (byte 0x89")


def test_oversized_profile_fails_before_parsing(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    inventory = write_deployment(shipped("reference"))
    # Valid YAML a parser would chew on for seconds: refused by size alone.
    (inventory.parent / "profile.yml").write_text("x: [" + "1, " * 500_000 + "1]\n")
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), "larger than 1024 KiB")


def test_yaml_alias_bomb(pdctl: Pdctl, write_deployment: Write) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    inventory = write_deployment("\n".join(lines) + "\n")
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), "more than 100000 values")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # PyYAML's scanner slows with the square of the flow depth; its composer recurses.
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
        ("x:\n" + "- " * 5000 + "1\n", "malformed YAML: nested too deeply"),
    ],
    ids=["flow", "block"],
)
def test_deeply_nested_profile(
    text: str, expected: str, pdctl: Pdctl, write_deployment: Write
) -> None:
    inventory = write_deployment(text)
    run = pdctl("validate", "-i", str(inventory))
    _assert_one_error(run, str(inventory.parent / "profile.yml"), expected)


def test_percent_and_dollar_rendered_escaped(
    pdctl: Pdctl, write_deployment: Write, shipped: Shipped
) -> None:
    profile = _set(shipped("reference"), "model.path", "/models/50%/$HOME")
    _set(profile, f"{ENV}.NCCL_DEBUG_SUBSYS", '$HOME "50%"')
    run = pdctl("render", "-i", str(write_deployment(profile)), "--instance", "pd0-decode")
    assert run.exit_code == 0, run.stderr
    assert '\n    --model-path "/models/50%%/$$HOME" \\\n' in run.stdout
    assert '\nNCCL_DEBUG_SUBSYS="\\$HOME \\"50%\\""\n' in run.stdout


def test_accepted_strings(load: Any, shipped: Shipped) -> None:
    """The rules refuse mistakes, not ordinary values: JSON, negative numbers, paths with
    spaces and Unicode in the model, `--flag=value`."""
    profile = _set(shipped("reference"), "model.path", "/models/My Model (v2) 50%/$x é")
    _set(profile, "model.served_name", "Model v2 日本")
    _set(profile, "engine.decode.env.NCCL_DEBUG", "INFO x=$y")
    args = [
        "--json-model-override-args", '{"rope_scaling":{"factor":4.0}}',
        "--chunked-prefill-size", "-1", "--lora-paths", "a=/m/a", "--random-seed=-7",
    ]  # fmt: skip
    _set(profile, "engine.prefill.extra_args", args)
    dep = load(profile)
    assert dep.profile.engine.prefill.extra_args == args
    assert dep.profile.model.path == "/models/My Model (v2) 50%/$x é"
