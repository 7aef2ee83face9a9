"""The sim's checks between a prefill and a decode (pdctl/sim/handshake.py), each against
sglang 0.5.23's text: what a prefill publishes through its bootstrap server, what the
decode's first contact with it raises (the decode dies), what each request's receiver
records (the request fails), and the start-up refusals of one role's flags on the other."""

from __future__ import annotations

import pytest

from pdctl.sim.args import SimConfig, resolve
from pdctl.sim.bootstrap import server_info
from pdctl.sim.handshake import (
    receiver_init_failure,
    registration,
    scheduler_crash,
    tp_differs_warning,
)
from pdctl.testing.stack import sim_args

POLICY = "--disaggregation-decode-allocation-policy"


def cfg(mode: str, *extra: str) -> SimConfig:
    return resolve(sim_args(mode, 30000, 8998, *extra), {})


def published(*extra: str) -> dict[str, object]:
    """What a decode reads from the bootstrap server of a prefill launched with `extra`."""
    return server_info(registration(cfg("prefill", *extra)))


def test_a_matching_pair_passes_every_check() -> None:
    info, decode = published("--tp-size", "2"), cfg("decode", "--tp-size", "2")
    assert scheduler_crash(info, decode) is None
    assert receiver_init_failure(info, decode) is None
    assert tp_differs_warning(info, decode) is None


def test_prefill_publishes_its_own_settings() -> None:
    info = published(
        "--page-size", "16", "--kv-cache-dtype", "fp8_e4m3", "--tp-size", "4",
        "--attn-cp-size", "2", "--pp-size", "2", "--enable-kv-cache-sharding",
    )  # fmt: skip
    assert info["page_size"] == 16 and info["kv_cache_dtype"] == "fp8_e4m3"
    assert (info["attn_tp_size"], info["attn_cp_size"], info["pp_size"]) == (2, 2, 2)
    assert info["decode_allocation_policy"] == "early"
    assert info["enable_kv_cache_sharding"] is True
    assert "kv_layout" not in info  # only a DeepSeek-V4 prefill publishes one


def test_page_size_mismatch_kills_the_decode() -> None:
    assert scheduler_crash(published("--page-size", "64"), cfg("decode")) == (
        "RuntimeError: Page size mismatch: prefill server has page_size=64, but decode server "
        "has page_size=1. Both servers must use the same --page-size value."
    )


def test_kv_dtype_mismatch_kills_the_decode() -> None:
    decode = cfg("decode", "--kv-cache-dtype", "fp8_e4m3")
    assert scheduler_crash(published(), decode) == (
        "RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype=auto, but "
        "decode server has kv_cache_dtype=fp8_e4m3. Both servers must use the same "
        "--kv-cache-dtype value."
    )


def test_page_size_is_checked_before_the_dtype() -> None:
    error = scheduler_crash(
        published("--page-size", "64"), cfg("decode", "--kv-cache-dtype", "bf16")
    )
    assert error is not None and error.startswith("RuntimeError: Page size mismatch")


def test_decode_attention_cp_kills_the_decode() -> None:
    decode = cfg("decode", "--tp-size", "2", "--attn-cp-size", "2")
    assert scheduler_crash(published(), decode) == (
        "AssertionError: ('Decode cp size (2) should be equal to 1',)"
    )


@pytest.mark.parametrize(("prefill_pp", "decode_pp", "dies"), [
    ("2", "1", False), ("2", "2", False), ("1", "2", True), ("2", "4", True),
])  # fmt: skip
def test_decode_pp_is_the_prefills_or_one(prefill_pp: str, decode_pp: str, dies: bool) -> None:
    error = scheduler_crash(
        published("--pp-size", prefill_pp), cfg("decode", "--pp-size", decode_pp)
    )
    expected = (
        f"AssertionError: ('Decode pp size ({decode_pp}) should be equal to prefill pp size "
        f"({prefill_pp}) or 1',)"
    )
    assert error == (expected if dies else None)


def test_attention_tp_differing_warns_for_a_non_mla_model() -> None:
    info, decode = published("--tp-size", "2"), cfg("decode", "--tp-size", "4")
    assert scheduler_crash(info, decode) is None
    assert tp_differs_warning(info, decode) == (
        "Performance is NOT guaranteed when using different TP sizes for non-MLA models. "
    )


@pytest.mark.parametrize(("prefill", "decode"), [
    ("early", "prefill_complete"), ("prefill_complete", "early"),
])  # fmt: skip
def test_allocation_policy_mismatch_fails_each_request(prefill: str, decode: str) -> None:
    # A prefill_complete engine runs at TP1 with Mooncake (its start-up check).
    info, decode_cfg = published(POLICY, prefill), cfg("decode", POLICY, decode)
    assert scheduler_crash(info, decode_cfg) is None
    assert receiver_init_failure(info, decode_cfg) == (
        f"Disaggregation decode allocation policy mismatch: prefill={prefill}, "
        f"decode={decode}. Set --disaggregation-decode-allocation-policy identically on both "
        "roles."
    )


@pytest.mark.parametrize("field", ["attn_tp_size", "attn_cp_size", "pp_size"])
def test_prefill_complete_needs_a_tp1_cp1_pp1_prefill(field: str) -> None:
    # No 0.5.23 prefill with prefill_complete starts at other sizes (_validate_prefill_complete),
    # so the published layout is edited: another version's prefill could publish it.
    info = {**published(POLICY, "prefill_complete"), field: 2}
    decode = cfg("decode", POLICY, "prefill_complete")
    assert receiver_init_failure(info, decode) == (
        "prefill_complete requires peer attention TP1/CP1/PP1"
    )
    assert receiver_init_failure(published(POLICY, "prefill_complete"), decode) is None


def test_a_prefill_without_the_policy_field_counts_as_early() -> None:
    info = {k: v for k, v in published().items() if k != "decode_allocation_policy"}
    assert receiver_init_failure(info, cfg("decode")) is None
    failure = receiver_init_failure(info, cfg("decode", POLICY, "prefill_complete"))
    assert failure is not None and "prefill=early, decode=prefill_complete" in failure


@pytest.mark.parametrize(("mode", "flags", "message"), [
    ("prefill", ["--disaggregation-decode-retraction-backup", "host_pool"],
     "ValueError: --disaggregation-decode-retraction-backup=host_pool is only supported on a "
     "PD decode server."),
    ("prefill", ["--disaggregation-decode-enable-offload-kvcache"],
     "ValueError: The argument disaggregation-decode-enable-offload-kvcache is only supported "
     "for decode side."),
    ("decode", ["--enable-kv-cache-sharding"],
     "ValueError: --enable-kv-cache-sharding is only supported on PD prefill workers: a rank's "
     "pool holds only its stripe of every cached page, which is incompatible with local "
     "decode."),
])  # fmt: skip
def test_a_flag_of_the_other_role_refuses_the_start(
    mode: str, flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as e:
        cfg(mode, *flags)
    assert str(e.value) == message


def test_role_flags_start_on_their_own_role() -> None:
    assert cfg("decode", "--disaggregation-decode-retraction-backup", "host_pool")
    assert cfg("decode", "--disaggregation-decode-enable-offload-kvcache")
    assert cfg("prefill", "--enable-kv-cache-sharding")
    assert cfg("prefill", "--disaggregation-decode-retraction-backup", "cpu_tensor")
