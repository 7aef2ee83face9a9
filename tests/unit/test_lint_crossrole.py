"""One test per cross-role condition of sglang 0.5.23 (docs/spec.md, "Cross-role conditions"):
each finding names both sides' values and the fix; bad input is refused in one line."""

from __future__ import annotations

from typing import Any

from pdctl.lint import Finding, Severity, lint
from tests.unit.test_lint import DECODE, POLICY, Load, Shipped, edit

P, D = "engine.prefill", "engine.decode"


def _found(load: Load, profile: dict[str, Any], rule: str) -> list[Finding]:
    return [f for f in lint(load(profile)) if f.id == rule]


def _sim(shipped: Shipped, edits: dict[str, Any]) -> dict[str, Any]:
    return edit(shipped("sim"), edits)


def test_allocation_policy_differs(load: Load, shipped: Shipped) -> None:
    # An abbreviation on one side is the same flag; the default equals an explicit `early`.
    same = {f"{P}.extra_args": ["--disaggregation-decode-alloc", "prefill_complete"],
            f"{D}.extra_args": [POLICY, "prefill_complete"]}  # fmt: skip
    assert not _found(load, _sim(shipped, same), "pair-setting-mismatch")
    (f,) = _found(load, _sim(shipped, {f"{D}.extra_args": [POLICY, "prefill_complete"]}),
                  "pair-setting-mismatch")  # fmt: skip
    assert f.severity is Severity.ERROR
    assert f"{POLICY} is early on prefill but prefill_complete on decode" in f.message
    assert "fails every request" in f.message and "CommonKVReceiver.init" in f.message
    assert f.fix.startswith("engine.common.extra_args")


def test_allocation_policy_unknown_value(load: Load, shipped: Shipped) -> None:
    (f,) = _found(load, _sim(shipped, {f"{P}.extra_args": [POLICY, "lazy"]}),
                  "pair-setting-mismatch")  # fmt: skip
    assert "is lazy on prefill but early on decode" in f.message
    assert "lazy is not one of early, prefill_complete" in f.message and "\n" not in f.message


def test_prefill_complete_needs_mooncake_and_tp1(load: Load, shipped: Shipped) -> None:
    profile = edit(shipped("reference"), {"engine.common.extra_args": [POLICY, "prefill_complete"]})
    found = _found(load, profile, "prefill-complete-layout")
    assert {f.where for f in found} == {"gpu-node-1/pd0-prefill, gpu-node-1/pd0-decode"}
    assert "transfer backend nixl, attention TP 4" in found[0].message
    # DP attention over the whole TP group leaves attention TP 1: only the backend is left.
    dp = [POLICY, "prefill_complete", "--dp-size", "4", "--enable-dp-attention"]
    (f,) = _found(load, edit(shipped("reference"), {"engine.common.extra_args": dp}),
                  "prefill-complete-layout")  # fmt: skip
    assert "with transfer backend nixl:" in f.message


def test_tp_ratio_reads_attention_tp(load: Load, shipped: Shipped) -> None:
    # tp 4 over attention DP 4 is attention TP 1 on the decode; 1 divides the prefill's 4.
    args = {f"{D}.extra_args": ["--attention-data-parallel-size", "4"]}
    profile = edit(shipped("reference"), args)
    assert not _found(load, profile, "group-tp-ratio")
    (f,) = _found(load, profile, "pair-layout-model-dependent")
    assert "attention TP 4 on the prefill and 1 on the decode" in f.message


def test_attention_tp_differs_warns(load: Load, shipped: Shipped) -> None:
    (f,) = _found(load, edit(shipped("reference"), {f"{DECODE}.tp": 2, f"{DECODE}.gpus": [4, 5]}),
                  "pair-layout-model-dependent")  # fmt: skip
    assert f.severity is Severity.WARNING and "MiniMax sparse" in f.message


def test_decode_attention_cp(load: Load, shipped: Shipped) -> None:
    (f,) = _found(load, edit(shipped("reference"), {f"{D}.extra_args": ["--attn-cp-size", "2"]}),
                  "pair-parallel-layout")  # fmt: skip
    assert "the decode runs attention CP 2" in f.message and "first request" in f.message
    assert f.fix.startswith("engine.decode.extra_args")


def test_decode_pp_one_takes_any_prefill_pp(load: Load, shipped: Shipped) -> None:
    profile = edit(shipped("reference"), {f"{P}.extra_args": ["--pipeline-parallel-size", "2"]})
    assert not _found(load, profile, "pair-parallel-layout")


def test_decode_dcp_against_prefill(load: Load, shipped: Shipped) -> None:
    dcp = {f"{D}.extra_args": ["--dcp-size", "2"]}
    cp = edit(shipped("reference"), {**dcp, f"{P}.extra_args": ["--attn-cp-size", "2"]})
    (f,) = _found(load, cp, "pair-parallel-layout")
    assert "decode DCP 2 needs prefill attention CP 1, not 2" in f.message
    shard = edit(shipped("reference"), {**dcp, f"{P}.extra_args": ["--enable-kv-cache-sharding"]})
    (f,) = _found(load, shard, "pair-parallel-layout")
    assert "--enable-kv-cache-sharding" in f.message


def test_dsv4_kv_layout_env(load: Load, shipped: Shipped) -> None:
    env = {f"{D}.env": {"SGLANG_DSV4_KV_LAYOUT": "v41"}}
    (f,) = _found(load, edit(shipped("reference"), env), "pair-setting-mismatch")
    assert "is default / v4 on prefill but default / v41 on decode" in f.message
    assert not _found(load, _sim(shipped, env), "pair-setting-differs")  # a named other family
    unnamed = _sim(shipped, {**env, "model.family": None})
    (f,) = _found(load, unnamed, "pair-setting-differs")
    assert "SGLANG_DSV4_KV_LAYOUT" in f.fix


def test_unified_memory_one_side(load: Load, shipped: Shipped) -> None:
    (f,) = _found(load, _sim(shipped, {f"{P}.extra_args": ["--enable-unified-memory"]}),
                  "pair-setting-mismatch")  # fmt: skip
    assert "--enable-unified-memory is on on prefill but off on decode" in f.message


def test_sampling_mask_env_one_side(load: Load, shipped: Shipped) -> None:
    # The env var's true words: "yes" on one side equals "1" on the other.
    same = {f"{P}.env": {"SGLANG_ENABLE_DISAGG_SAMPLING_MASK": "yes"},
            f"{D}.env": {"SGLANG_ENABLE_DISAGG_SAMPLING_MASK": "1"}}  # fmt: skip
    assert not _found(load, _sim(shipped, same), "pair-setting-mismatch")
    one = {f"{D}.env": {"SGLANG_ENABLE_DISAGG_SAMPLING_MASK": "1"}}
    (f,) = _found(load, _sim(shipped, one), "pair-setting-mismatch")
    assert "is off on prefill but on on decode" in f.message
    assert (
        f.fix == "engine.common.env.SGLANG_ENABLE_DISAGG_SAMPLING_MASK: set it once for both roles"
    )


def test_sampling_mask_tokens(load: Load, shipped: Shipped) -> None:
    tokens = {f"{D}.extra_args": ["--sampling-mask-max-tokens", "64"]}
    assert not _found(load, _sim(shipped, tokens), "pair-setting-mismatch")  # masks off
    on = {**tokens, "engine.common.env.SGLANG_ENABLE_DISAGG_SAMPLING_MASK": "1"}
    (f,) = _found(load, _sim(shipped, on), "pair-setting-mismatch")
    assert "is default on prefill but 64 on decode" in f.message


def test_speculative_on_one_side(load: Load, shipped: Shipped) -> None:
    eagle = {f"{D}.extra_args": ["--speculative-algorithm", "EAGLE"]}
    (f,) = _found(load, _sim(shipped, eagle), "pair-setting-mismatch")
    assert "is none on prefill but EAGLE on decode" in f.message
    ngram = {f"{D}.extra_args": ["--speculative-algorithm", "NGRAM"]}  # carries no hidden states
    assert not _found(load, _sim(shipped, ngram), "pair-setting-mismatch")
    drafts = {"engine.common.extra_args": ["--speculative-algorithm", "EAGLE3"],
              f"{P}.extra_args": ["--speculative-draft-model", "/m/a"],
              f"{D}.extra_args": ["--speculative-draft-model-path", "/m/b"]}  # fmt: skip
    (f,) = _found(load, _sim(shipped, drafts), "pair-setting-differs")
    assert "is /m/a on prefill but /m/b on decode" in f.message


def test_mooncake_transport_env(load: Load, shipped: Shipped) -> None:
    mooncake = {"engine.transfer_backend": "mooncake", f"{D}.env": {"MC_FORCE_TCP": "1"}}
    (f,) = _found(load, _sim(shipped, mooncake), "pair-setting-differs")
    assert "is rdma on prefill but tcp on decode" in f.message
    # mooncake_tcp only sets MC_FORCE_TCP when unset: an explicit 0 keeps that side on RDMA.
    tcp = {"engine.transfer_backend": "mooncake_tcp", f"{P}.env": {"MC_FORCE_TCP": "0"}}
    (f,) = _found(load, _sim(shipped, tcp), "pair-setting-differs")
    assert "is rdma on prefill but tcp on decode" in f.message


def test_role_flags(load: Load, shipped: Shipped) -> None:
    backup = {f"{P}.extra_args": ["--disaggregation-decode-retraction-backup", "host_pool"]}
    (f,) = _found(load, _sim(shipped, backup), "role-flag-refused")
    assert "host_pool is read by a decode only: this prefill refuses to start" in f.message
    cpu = {f"{P}.extra_args": ["--disaggregation-decode-retraction-backup", "cpu_tensor"]}
    assert _found(load, _sim(shipped, cpu), "role-flag-ignored")
    assert not _found(load, _sim(shipped, cpu), "role-flag-refused")
    shard = {f"{D}.extra_args": ["--enable-kv-cache-sharding"]}
    (f,) = _found(load, _sim(shipped, shard), "role-flag-refused")
    assert f.where.endswith("pd0-decode") and "engine.prefill.extra_args" in f.fix
    # From common extra_args a decode-only flag lands on the prefill too.
    radix = {"engine.common.extra_args": ["--disaggregation-decode-enable-radix-cache"]}
    (f,) = _found(load, _sim(shipped, radix), "role-flag-ignored")
    assert f.where.endswith("pd0-prefill") and f.fix.startswith("engine.common.extra_args")
