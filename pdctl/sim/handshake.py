"""What a prefill publishes about itself and what a decode checks against it when they first
meet, as sglang 0.5.23's `disaggregation/common/conn.py` does.

A prefill registers its layout with its own bootstrap server (CommonKVManager
.register_to_bootstrap, `PUT /route`); a decode fetches it on its first request to that
prefill (CommonKVManager.try_ensure_parallel_info, `GET /route` with all ranks -1) and holds
it against its own settings twice:
- once per prefill, at that first fetch: try_ensure_parallel_info raises a RuntimeError and
  _resolve_rank_mapping an AssertionError, out of the decode scheduler's event loop, so the
  decode server dies (`scheduler_crash`);
- once per request, as its receiver starts (CommonKVReceiver.init): the request fails its
  handshake with the reason recorded (`receiver_init_failure`).
Each side knows only its own settings and what the other published.
"""

from __future__ import annotations

from collections.abc import Mapping

from .args import SimConfig

Info = Mapping[str, object]  # a prefill's published layout (PrefillServerInfo's fields)


def attn_tp_size(cfg: SimConfig) -> int:
    """runtime_context.derive_attn_tp_size without DP attention (the sim has none)."""
    return max(cfg.args.tp_size // cfg.args.attn_cp_size, 1)


def registration(cfg: SimConfig) -> dict[str, object]:
    """The prefill's `PUT /route` body (register_to_bootstrap), for its one rank."""
    a = cfg.args
    return {
        "attn_tp_size": attn_tp_size(cfg),
        "attn_tp_rank": 0,
        "attn_cp_size": a.attn_cp_size,
        "attn_cp_rank": 0,
        "attn_dp_size": a.dp_size,
        "attn_dp_rank": 0,
        "pp_size": a.pp_size,
        "pp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "rank_ip": a.host,
        "rank_port": a.disaggregation_bootstrap_port,
        "page_size": cfg.page_size,
        "kv_cache_dtype": a.kv_cache_dtype,
        "kv_layout": None,  # DeepSeek-V4 only
        "enable_dsa_cache_layer_split": False,
        "enable_kv_cache_sharding": a.enable_kv_cache_sharding,
        "prefill_http_port": a.port,
        "decode_allocation_policy": a.disaggregation_decode_allocation_policy,
    }


def scheduler_crash(info: Info, cfg: SimConfig) -> str | None:
    """The exception (type: message) try_ensure_parallel_info or _resolve_rank_mapping raises
    for this prefill, in their order; None when the decode can use it. The checks of layouts
    the sim cannot have (MiniMax, DeepSeek-V4 KV layouts, MXFP8 block scales, DCP, MLA KV
    sharding) are left out (docs/sim.md)."""
    a = cfg.args
    if info.get("page_size") is not None and info["page_size"] != cfg.page_size:
        return (
            f"RuntimeError: Page size mismatch: prefill server has page_size={info['page_size']}, "
            f"but decode server has page_size={cfg.page_size}. "
            "Both servers must use the same --page-size value."
        )
    dtype = info.get("kv_cache_dtype")
    if dtype is not None and dtype != a.kv_cache_dtype:
        return (
            f"RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype={dtype}, "
            f"but decode server has kv_cache_dtype={a.kv_cache_dtype}. "
            "Both servers must use the same --kv-cache-dtype value."
        )
    # The asserts' messages are one-element tuples in SGLang (a trailing comma), and print so.
    if a.attn_cp_size != 1:
        return f"AssertionError: ('Decode cp size ({a.attn_cp_size}) should be equal to 1',)"
    if a.pp_size not in (info.get("pp_size"), 1):
        return (
            f"AssertionError: ('Decode pp size ({a.pp_size}) should be equal to prefill pp size "
            f"({info.get('pp_size')}) or 1',)"
        )
    return None


def tp_differs_warning(info: Info, cfg: SimConfig) -> str | None:
    """_resolve_rank_mapping's warning (once per process) for a non-MLA model, which the
    sim's model is, when the attention TP sizes differ."""
    if info.get("attn_tp_size") == attn_tp_size(cfg):
        return None
    return "Performance is NOT guaranteed when using different TP sizes for non-MLA models. "


def receiver_init_failure(info: Info, cfg: SimConfig) -> str | None:
    """The failure CommonKVReceiver.init records for each request to this prefill."""
    policy = cfg.args.disaggregation_decode_allocation_policy
    published = info.get("decode_allocation_policy", "early")
    if published != policy:
        return (
            "Disaggregation decode allocation policy mismatch: "
            f"prefill={published}, decode={policy}. "
            "Set --disaggregation-decode-allocation-policy identically on both roles."
        )
    if policy == "prefill_complete" and any(
        info.get(k) != 1 for k in ("attn_tp_size", "attn_cp_size", "pp_size")
    ):
        return "prefill_complete requires peer attention TP1/CP1/PP1"
    return None
