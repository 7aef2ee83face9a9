"""Every rendered launch line of every shipped profile, parsed by SGLang's own argparse parser."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pdctl.render import launch_args
from pdctl.spec import Deployment, Instance, Role, load_deployment
from tests.conftest import CACHE, ROOT, require_path

pytestmark = pytest.mark.parser

PROFILES = sorted((ROOT / "deploy" / "profiles").glob("*.yml"))


def sglang_parse(argvs: list[list[str]]) -> list[dict]:
    python = require_path(CACHE / "sglang-parser" / "bin" / "python", "SGLang parser environment")
    out = subprocess.run(
        [str(python), str(ROOT / "scripts" / "sglang-parse.py")],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
    )
    return json.loads(out.stdout)


def deployment_for(profile: Path, tmp_path: Path) -> Deployment:
    """The profile on one host, or on the hosts its groups across hosts name."""
    groups = yaml.safe_load(profile.read_text())["layout"].get("groups", [])
    named = [m["host"] for g in groups for m in g["prefill"] + g["decode"] if "host" in m]
    hosts = "\n".join(dict.fromkeys(named)) or "host-a"
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        f"[pd_hosts]\n{hosts}\n[router]\n{hosts.split()[0]}\n"
        f"[all:vars]\npdstack_profile={profile}\n"
    )
    return load_deployment(inventory)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Instance, dict]]:
    cases: list[tuple[str, Instance, list[str]]] = []
    for profile in PROFILES:
        dep = deployment_for(profile, tmp_path_factory.mktemp(profile.stem))
        cases += [(profile.stem, inst, launch_args(inst, dep)) for inst in dep.instances]
    dep = load_deployment(ROOT / "inventory.ini")
    cases += [("inventory.ini", inst, launch_args(inst, dep)) for inst in dep.instances]
    results = sglang_parse([argv for _, _, argv in cases])
    return [(name, inst, res) for (name, inst, _), res in zip(cases, results, strict=True)]


def test_profiles_are_shipped() -> None:
    assert {p.stem for p in PROFILES} >= {"reference", "sim"}


def test_every_rendered_line_parses(rendered: list[tuple[str, Instance, dict]]) -> None:
    failures = [
        f"{name} {inst.id}: {res['error']}" for name, inst, res in rendered if not res["ok"]
    ]
    assert not failures, "\n".join(failures)


def test_parsed_values_match_the_spec(rendered: list[tuple[str, Instance, dict]]) -> None:
    for name, inst, res in rendered:
        args, t = res["args"], inst.tuning
        where = f"{name} {inst.id}"
        assert args["disaggregation_mode"] == inst.role.value, where
        assert args["tp_size"] == inst.tp, where
        assert args["port"] == inst.port, where
        assert args.get("context_length") == t.context_length, where
        assert args.get("mem_fraction_static") == t.mem_fraction_static, where
        if inst.role is Role.PREFILL:
            assert args["disaggregation_bootstrap_port"] == inst.bootstrap_port, where
        if inst.role is Role.DECODE and t.cuda_graph_bs:
            assert args["cuda_graph_bs_decode"] == t.cuda_graph_bs, where
            assert args["cuda_graph_max_bs_decode"] == t.cuda_graph_max_bs, where


def test_parser_rejects_the_ambiguous_pre_0_5_15_flag() -> None:
    [res] = sglang_parse([["--model-path", "/m", "--cuda-graph-max-bs", "32"]])
    assert not res["ok"]
    assert "ambiguous option: --cuda-graph-max-bs" in res["error"]
