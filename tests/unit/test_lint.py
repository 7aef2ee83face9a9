"""Every lint rule, each with a profile that trips it and a near miss that does not."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdctl.lint import RULES, Finding, Severity, lint
from pdctl.spec import Deployment
from tests.conftest import CACHE, ROOT, require_path

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]
DELETE = object()
DECODE = "layout.pairs.0.decode"
POLICY = "--disaggregation-decode-allocation-policy"


def edit(profile: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """Apply {"a.b.0.c": value} edits (DELETE removes the key), creating mappings on the way."""
    for path, value in edits.items():
        *parents, last = path.split(".")
        node: Any = profile
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return profile


@dataclass(frozen=True)
class Case:
    rule: str
    bad: dict[str, Any]  # edits that trip the rule
    good: dict[str, Any]  # a near miss that passes it
    fix: str  # the fix must name this key path
    base: str = "reference"
    router: str | None = None  # inventory [router] host for the good case
    routers: str | None = None  # inventory [router] hosts (one a line) for both cases
    extra: dict[str, Any] = field(default_factory=dict)  # edits applied to both
    etcd: str | None = None  # inventory [etcd] hosts (one a line) for the bad case
    etcd_good: str | None = None  # and for the good case
    hosts: list[str] | None = None  # inventory [pd_hosts] for both cases


RDMA = {"hardware.rdma_nics": ["mlx5_0"]}
# The sim profile with a second pair on two more pretend GPUs.
TWO_PAIRS = {
    "hardware.gpu_count": 4,
    "hardware.numa_gpus": {0: [0, 1, 2, 3]},
    "layout.pairs": [
        {"name": "pd0", "prefill": {"numa_node": 0, "gpus": [0], "port": 30000,
                                    "bootstrap_port": 8998},
         "decode": {"numa_node": 0, "gpus": [1], "port": 30001}},
        {"name": "pd1", "prefill": {"numa_node": 0, "gpus": [2], "port": 30010,
                                    "bootstrap_port": 9008},
         "decode": {"numa_node": 0, "gpus": [3], "port": 30011}},
    ],
}  # fmt: skip
# The sim profile's pair and a host-local 2P1D group g0 beside it (TP 1 and 2 prefills).
GROUP = {
    "hardware.gpu_count": 8,
    "hardware.numa_gpus": {0: [0, 1, 2, 3, 4, 5, 6, 7]},
    "layout.groups": [
        {"name": "g0",
         "prefill": [{"numa_node": 0, "gpus": [2], "port": 30010, "bootstrap_port": 9010},
                     {"numa_node": 0, "gpus": [3, 4], "port": 30012, "bootstrap_port": 9012}],
         "decode": [{"numa_node": 0, "gpus": [5, 6], "port": 30011}]},
    ],
}  # fmt: skip
G0 = "layout.groups.0"
# The sim profile's pair on every host and a 1P1D group g1 across two hosts (its prefill on
# gpu-node-1, its decode on gpu-node-2), on the third pretend GPU of each.
ACROSS = {
    "hardware.gpu_count": 4,
    "hardware.numa_gpus": {0: [0, 1, 2, 3]},
    "layout.groups": [
        {"name": "g1", "allow_tcp_kv": True,
         "prefill": [{"host": "gpu-node-1", "numa_node": 0, "gpus": [2], "port": 30010,
                      "bootstrap_port": 9010}],
         "decode": [{"host": "gpu-node-2", "numa_node": 0, "gpus": [2], "port": 30011}]},
    ],
}  # fmt: skip
TWO_HOSTS = ["gpu-node-1", "gpu-node-2"]
CASES = [
    Case("gpu-overlap", {f"{DECODE}.gpus": [3, 4, 5, 6]}, {f"{DECODE}.gpus": [4, 5, 6, 7]},
         "layout.pairs[0].decode.gpus"),
    Case("gpu-out-of-range", {"hardware.gpu_count": 6}, {"hardware.gpu_count": 8},
         "hardware.gpu_count"),
    Case("tp-mismatch", {f"{DECODE}.tp": 2}, {f"{DECODE}.tp": 4}, "layout.pairs[0].decode.tp"),
    Case("numa-unknown-node", {f"{DECODE}.numa_node": 2},
         {f"{DECODE}.numa_node": 2, "hardware.numa_gpus": DELETE},
         "layout.pairs[0].decode.numa_node"),
    Case("numa-mismatch", {f"{DECODE}.numa_node": 0}, {f"{DECODE}.numa_node": 1},
         "layout.pairs[0].decode.numa_node"),
    Case("port-collision", {"router.metrics_port": 30001}, {"router.metrics_port": 30001},
         "router.metrics_port", router="ctl-1"),
    Case("port-collision", {"etcd.client_port": 8000}, {"etcd.client_port": 8001},
         "etcd.client_port"),
    Case("port-collision", {"etcd.metrics_port": 30000}, {"etcd.metrics_port": 30000},
         "etcd.metrics_port", etcd="gpu-node-1", etcd_good="etcd-1"),
    Case("port-collision", {f"{DECODE}.port": 8998}, {f"{DECODE}.port": 8999},
         "layout.pairs[0].decode.port"),
    Case("pair-mismatch", {"engine.decode.page_size": 64}, {"engine.common.page_size": 64},
         "engine.common.page_size"),
    Case("pair-mismatch", {"engine.prefill.extra_args": ["--context-length", "4096"]},
         {"engine.common.extra_args": ["--trust-remote-code", "--context-length", "4096"]},
         "extra_args"),
    Case("pair-mismatch", {"engine.decode.kv_cache_dtype": "fp8_e4m3"},
         {"engine.common.kv_cache_dtype": "fp8_e4m3"}, "engine.common.kv_cache_dtype"),
    Case("pair-routing", {"router.policy": "cache_aware"}, {"router.policy": "round_robin"},
         "router.policy: round_robin", base="sim", extra=TWO_PAIRS),
    Case("pair-routing", {"router.extra_args": ["--decode-policy", "power_of_two"]},
         {"router.extra_args": ["--decode-policy", "round_robin"]}, "router.extra_args",
         base="sim", extra=TWO_PAIRS),
    Case("pair-timeout-mismatch",
         {"engine.decode.env": {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 600}},
         {"engine.common.env.SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 600},
         "engine.common.env.SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
    Case("gpu-overlap", {f"{G0}.decode.0.gpus": [4, 5]}, {f"{G0}.decode.0.gpus": [6, 7]},
         "layout.groups[0].decode[0].gpus", base="sim", extra=GROUP),
    Case("port-collision", {f"{G0}.prefill.1.bootstrap_port": 9010},
         {f"{G0}.prefill.1.bootstrap_port": 9011}, "layout.groups[0].prefill[1].bootstrap_port",
         base="sim", extra=GROUP),
    Case("pair-mismatch", {"engine.decode.page_size": 16}, {"engine.common.page_size": 16},
         "engine.common.page_size", base="sim", extra=GROUP),
    Case("group-tp-ratio", {f"{G0}.decode.0.gpus": [5, 6, 7]}, {f"{G0}.decode.0.gpus": [5]},
         "layout.groups[0].decode[0].gpus", base="sim", extra=GROUP),
    Case("gpu-overlap", {f"{G0}.decode.0.gpus": [1]}, {f"{G0}.decode.0.gpus": [3]},
         "layout.groups[0].decode[0].gpus", base="sim", extra=ACROSS, hosts=TWO_HOSTS),
    Case("port-collision", {f"{G0}.decode.0.port": 30001}, {f"{G0}.decode.0.port": 30010},
         "layout.groups[0].decode[0].port", base="sim", extra=ACROSS, hosts=TWO_HOSTS),
    Case("group-tcp-kv", {}, {f"{G0}.decode.0.host": "gpu-node-1", f"{G0}.decode.0.gpus": [3]},
         "layout.groups[0]: give its hosts RDMA", base="sim", extra=ACROSS, hosts=TWO_HOSTS),
    Case("pair-setting-mismatch", {"engine.decode.extra_args": [POLICY, "prefill_complete"]},
         {"engine.decode.extra_args": [POLICY, "early"]}, "engine.common.extra_args"),
    Case("pair-setting-differs",
         {"engine.prefill.extra_args": ["--disaggregation-enable-kv-checksum"]},
         {"engine.common.extra_args": ["--disaggregation-enable-kv-checksum"]},
         "engine.common.extra_args"),
    Case("pair-parallel-layout", {"engine.decode.extra_args": ["--pp-size", "2"]},
         {"engine.common.extra_args": ["--pp-size", "2"]}, "engine.decode.extra_args"),
    Case("prefill-complete-layout", {"engine.common.extra_args": [POLICY, "prefill_complete"]},
         {"engine.common.extra_args": [POLICY, "prefill_complete"],
          "engine.transfer_backend": "mooncake"}, "engine.common.extra_args", base="sim"),
    Case("pair-layout-model-dependent", {"engine.decode.extra_args": ["--dcp-size", "2"]},
         {"engine.prefill.extra_args": ["--dcp-size", "2"]}, "layout"),
    Case("role-flag-refused",
         {"engine.prefill.extra_args": ["--disaggregation-decode-enable-offload-kvcache"]},
         {"engine.decode.extra_args": ["--disaggregation-decode-enable-offload-kvcache"]},
         "engine.prefill.extra_args"),
    Case("role-flag-ignored", {"engine.prefill.extra_args": ["--cuda-graph-max-bs-decode", "96"]},
         {"engine.decode.extra_args": ["--cuda-graph-max-bs-decode", "96"]},
         "engine.prefill.extra_args"),
    Case("decode-eager-fallback", {"engine.decode.max_running_requests": 128},
         {"engine.decode.max_running_requests": 96}, "engine.decode.max_running_requests"),
    Case("decode-eager-fallback", {"engine.decode.max_running_requests": DELETE},
         {"engine.decode.max_running_requests": DELETE, "engine.decode.disable_cuda_graph": True},
         "engine.decode.max_running_requests"),
    Case("graph-size-unset",
         {"engine.decode.cuda_graph_max_bs": DELETE, "engine.decode.cuda_graph_bs": DELETE},
         {"engine.decode.cuda_graph_bs": DELETE}, "engine.decode.cuda_graph_max_bs"),
    Case("graph-buckets-order", {"engine.decode.cuda_graph_bs": [1, 4, 2, 2, 96]},
         {"engine.decode.cuda_graph_bs": [1, 2, 4, 96]}, "engine.decode.cuda_graph_bs"),
    Case("graph-buckets-above-max", {"engine.decode.cuda_graph_max_bs": 64},
         {"engine.decode.cuda_graph_max_bs": 96}, "engine.decode.cuda_graph_max_bs"),
    Case("memory-weights", {"model.weights_gib_per_gpu": 60}, {"model.weights_gib_per_gpu": 34},
         "mem_fraction_static"),
    # The seed's history: 0.85 with graphs up to 32 OOMed at capture, 0.70 with 32 ran.
    Case("memory-oom", {"engine.common.mem_fraction_static": 0.85},
         {"engine.common.mem_fraction_static": 0.70}, "engine.common.mem_fraction_static: 0.81",
         extra={"engine.decode.max_running_requests": 32, "engine.decode.cuda_graph_max_bs": 32,
                "engine.decode.cuda_graph_bs": [1, 2, 4, 8, 16, 24, 32]}),
    Case("memory-tight", {"engine.common.mem_fraction_static": 0.61},
         {"engine.common.mem_fraction_static": 0.60}, "engine.common.mem_fraction_static: 0.6"),
    Case("memory-fraction-unset", {"engine.common.mem_fraction_static": DELETE},
         {"engine.common.mem_fraction_static": 0.6}, "engine.prefill.mem_fraction_static"),
    Case("nixl-ucx-devices", RDMA, {**RDMA, "engine.common.env.UCX_NET_DEVICES": "mlx5_0:1"},
         "engine.common.env.UCX_NET_DEVICES"),
    Case("ucx-unknown-device", {**RDMA, "engine.common.env.UCX_NET_DEVICES": "mlx5_9:1"},
         {**RDMA, "engine.common.env.UCX_NET_DEVICES": "mlx5_0:1,eth0"},
         "engine.common.env.UCX_NET_DEVICES"),
    Case("mooncake-ib-device", RDMA,
         {**RDMA, "engine.common.extra_args": ["--disaggregation-ib-device", "mlx5_0"]},
         "extra_args", extra={"engine.transfer_backend": "mooncake"}),
    Case("unknown-flag", {"engine.common.extra_args": ["--trust-remote-codes"]},
         {"engine.common.extra_args": ["--trust-remote-code"]}, "engine.common.extra_args"),
    Case("ambiguous-flag", {"engine.decode.extra_args": ["--cuda-graph-max-bs", "96"]},
         {"engine.decode.extra_args": ["--cuda-graph-max-bs-decode", "96"]},
         "engine.decode.extra_args"),
    Case("flags-unchecked", {"versions.sglang": "0.4.0"}, {"versions.sglang": "0.5.23"},
         "versions.sglang"),
    Case("noop-flag", {"engine.decode.extra_args": ["--num-continuous-decode-steps", "4"]},
         {"engine.decode.extra_args": ["--num-continuous-decode-steps-typo"]},
         "engine.decode.extra_args"),
    Case("dsv4-multi-stream-overlap",
         {"engine.common.env.SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": DELETE},
         {"engine.common.env.SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": DELETE, "model.family": "sim",
          "model.path": "/models/other", "model.served_name": "other"},
         "engine.common.env.SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"),
    Case("dsv4-context-uncapped", {"engine.common.context_length": 1048576},
         {"engine.common.context_length": 131072}, "engine.common.context_length"),
    Case("dsv4-context-uncapped", {"engine.common.context_length": DELETE},
         {"engine.common.context_length": DELETE, "model.family": "deepseek-v3",
          "model.path": "/models/DeepSeek-V3", "model.served_name": "dsv3"},
         "engine.common.context_length"),
    Case("context-over-native", {"model.native_context_length": 4096},
         {"model.native_context_length": 8192}, "engine.common.context_length",
         extra={"engine.common.env.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}),
    Case("router-host-shared", {"router.host": "10.0.0.11"}, {"router.host": "0.0.0.0"},
         "router.host: 0.0.0.0", routers="ctl-1\nctl-2"),
    Case("etcd-members", {}, {}, "add an [etcd] group", etcd="", etcd_good="gpu-node-1"),
    Case("etcd-members", {}, {}, "[etcd]: 3 or 5 hosts", etcd="e1\ne2\ne3\ne4",
         etcd_good="e1\ne2\ne3"),
    Case("etcd-two-members", {}, {}, "[etcd]: add a third host", etcd="e1\ne2",
         etcd_good="e1\ne2\ne3"),
]  # fmt: skip


def _findings(dep: Deployment, rule: str) -> list[Finding]:
    return [f for f in lint(dep) if f.id == rule]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_rule_trips_on_bad_profile(case: Case, load: Load, shipped: Shipped) -> None:
    dep = load(
        edit(edit(shipped(case.base), case.extra), case.bad),
        router=case.routers,
        etcd=case.etcd,
        hosts=case.hosts,
    )
    found = _findings(dep, case.rule)
    assert found, f"{case.rule} did not fire; got {[f.id for f in lint(dep)]}"
    severity = next(r.severity for r in RULES if r.id == case.rule)
    assert all(f.severity is severity for f in found)
    assert any(case.fix in f.fix for f in found), [f.fix for f in found]
    assert all(f.message and f.where for f in found)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_rule_passes_near_miss(case: Case, load: Load, shipped: Shipped) -> None:
    dep = load(
        edit(edit(shipped(case.base), case.extra), case.good),
        router=case.router or case.routers,
        etcd=case.etcd_good,
        hosts=case.hosts,
    )
    assert not _findings(dep, case.rule)


def test_every_rule_has_a_case() -> None:
    assert {r.id for r in RULES} == {c.rule for c in CASES}


@pytest.mark.parametrize("name", ["reference", "sim"])
def test_shipped_profiles_are_clean(name: str, load: Load, shipped: Shipped) -> None:
    assert lint(load(shipped(name))) == []


def test_two_hosts_merge_repeated_findings(load: Load, shipped: Shipped) -> None:
    hosts = ["gpu-node-1", "gpu-node-2"]
    assert lint(load(shipped("reference"), hosts=hosts)) == []
    dep = load(edit(shipped("reference"), {f"{DECODE}.tp": 2}), hosts=hosts)
    # tp 2 also differs from the prefill's 4: pair-layout-model-dependent warns per pair.
    (finding,) = _findings(dep, "tp-mismatch")
    assert finding.where == "gpu-node-1/pd0-decode, gpu-node-2/pd0-decode"


def test_pair_routing_explains_why_and_counts_pairs_across_hosts(
    load: Load, shipped: Shipped
) -> None:
    cache_aware = edit(shipped("reference"), {"router.policy": "cache_aware"})
    assert not _findings(load(cache_aware), "pair-routing")  # one pair: nothing to mix
    hosts = ["gpu-node-1", "gpu-node-2"]
    (finding,) = _findings(load(cache_aware, hosts=hosts), "pair-routing")
    assert finding.severity is Severity.ERROR
    assert "2 pairs" in finding.message and "prefill cache_aware over 2" in finding.message
    assert "stale state in every prefill that served it" in finding.message
    assert "over TCP" in finding.message


def test_pair_routing_refuses_unequal_worker_counts(load: Load, shipped: Shipped) -> None:
    extra = edit(shipped("sim"), TWO_PAIRS)
    edit(extra, {"router.extra_args": ["--prefill", "http://10.0.0.9:30000", "8998"]})
    (finding,) = _findings(load(extra), "pair-routing")
    assert "prefill round_robin over 3, decode round_robin over 2" in finding.message


def test_host_override_is_checked_and_named(load: Load, shipped: Shipped) -> None:
    small = {"gpu_count": 4, "gpu_memory_mib": 97887, "numa_gpus": {0: [0, 1, 2, 3]}}
    profile = edit(shipped("reference"), {"hosts": {"gpu-node-2": {"hardware": small}}})
    dep = load(profile, hosts=["gpu-node-1", "gpu-node-2"])
    by_id = {f.id: f for f in lint(dep)}
    assert set(by_id) == {"gpu-out-of-range", "numa-unknown-node"}
    assert by_id["gpu-out-of-range"].where == "gpu-node-2/pd0-decode"
    assert "hosts.gpu-node-2.hardware.gpu_count" in by_id["gpu-out-of-range"].fix


def test_port_collision_with_router_only_on_router_host(load: Load, shipped: Shipped) -> None:
    profile = edit(shipped("reference"), {"router.port": 30000})
    hosts = ["gpu-node-1", "gpu-node-2"]
    found = _findings(load(profile, hosts=hosts, router="gpu-node-2"), "port-collision")
    assert [f.where for f in found] == ["gpu-node-2"]
    assert "pd0-prefill HTTP, router" in found[0].message


def test_flag_findings_name_candidates_and_source(load: Load, shipped: Shipped) -> None:
    profile = edit(shipped("reference"), {"engine.decode.extra_args": ["--cuda-graph-max-bs", "8"]})
    (finding,) = _findings(load(profile), "ambiguous-flag")
    assert "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in finding.message
    profile = edit(shipped("reference"), {"engine.common.extra_args": ["--trust-remote-codes"]})
    (finding,) = _findings(load(profile), "unknown-flag")
    assert "did you mean --trust-remote-code" in finding.message
    assert finding.where == "gpu-node-1/pd0-prefill, gpu-node-1/pd0-decode"


def test_severities_are_error_or_warning() -> None:
    assert {r.severity for r in RULES} == {Severity.ERROR, Severity.WARNING}
    assert len({r.id for r in RULES}) == len(RULES)


def test_docs_list_every_rule() -> None:
    docs = (ROOT / "docs" / "spec.md").read_text()
    for r in RULES:
        assert f"| `{r.id}` | {r.severity} |" in docs, r.id


@pytest.mark.parser
def test_flag_list_matches_sglangs_parser() -> None:
    """The committed list is what scripts/sglang-flags.py prints from the pinned parser."""
    python = require_path(CACHE / "sglang-parser" / "bin" / "python", "SGLang parser environment")
    out = subprocess.run(
        [str(python), str(ROOT / "scripts" / "sglang-flags.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    version = out.split()[4]  # "# Options of sglang <version> …"
    assert out == (ROOT / "pdctl" / "data" / f"sglang-{version}-flags.txt").read_text()
