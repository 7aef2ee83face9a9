"""Scheduler log lines in sglang 0.5.23's format, written to stdout.

Format from `sglang/srt/utils/common.py` configure_logger (`[%(asctime)s{prefix}] %(message)s`,
datefmt `%Y-%m-%d %H:%M:%S`), the prefix from `managers/scheduler.py`
configure_scheduler_process (" DP{n}" when a DP controller runs, i.e. dp > 1, then " PP{n}",
" ATTN_CP{n}", " MOE_DP{n}", " TP{n}", " EP{n}" each when its size is > 1) and the message
bodies from `managers/scheduler_components/metrics_reporter.py` (report_prefill_stats,
report_decode_stats) with the default pool (no SWA/mamba) and metrics-device-timer off.
The sim is the stats-logging rank: every rank in the prefix is 0.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

LOGGER_NAME = "pdctl.sim"


def rank_prefix(
    tp_size: int,
    dp_size: int = 1,
    pp_size: int = 1,
    ep_size: int = 1,
    attn_cp_size: int = 1,
    moe_dp_size: int = 1,
) -> str:
    dims = (
        ("DP", dp_size),
        ("PP", pp_size),
        ("ATTN_CP", attn_cp_size),
        ("MOE_DP", moe_dp_size),
        ("TP", tp_size),
        ("EP", ep_size),
    )
    return "".join(f" {name}0" for name, size in dims if size > 1)


def configure(level: str, prefix: str) -> logging.Logger:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    )
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(getattr(logging, level.upper(), logging.INFO))
    logger.propagate = False
    return logger


@dataclass(frozen=True)
class PrefillStats:
    new_seq: int
    new_token: int
    cached_token: int
    token_usage: float
    running_req: int
    queue_req: int
    pending_token: int
    cuda_graph: bool
    input_throughput: float
    # Present on a prefill server only.
    bootstrap_req: int | None = None
    inflight_req: int | None = None
    optimistic_req: int | None = None


def prefill_line(s: PrefillStats) -> str:
    msg = (
        f"Prefill batch, #new-seq: {s.new_seq}, #new-token: {s.new_token}, "
        f"#cached-token: {s.cached_token}, token usage: {s.token_usage:.2f}, "
        f"#running-req: {s.running_req}, #queue-req: {s.queue_req}, "
        f"#pending-token: {s.pending_token}, "
    )
    if s.bootstrap_req is not None:
        msg += (
            f"#bootstrap-req: {s.bootstrap_req}, #inflight-req: {s.inflight_req}, "
            f"#optimistic-req: {s.optimistic_req}, "
        )
    return msg + f"cuda graph: {s.cuda_graph}, input throughput (token/s): {s.input_throughput:.2f}"


@dataclass(frozen=True)
class DecodeStats:
    running_req: int
    num_token: int
    token_usage: float
    cuda_graph: bool
    gen_throughput: float
    queue_req: int
    # Present on a decode server only.
    preallocated_usage: float | None = None
    prealloc_req: int | None = None
    transfer_req: int | None = None
    retracted_req: int | None = None
    # With --disaggregation-decode-host-receive-threshold < 1 only.
    host_receive_req: int | None = None
    # Speculative decoding only: tokens per request per step, and correct drafts / drafts.
    accept_len: float | None = None
    accept_rate: float | None = None


def decode_line(s: DecodeStats) -> str:
    msg = (
        f"Decode batch, #running-req: {s.running_req}, #token: {s.num_token}, "
        f"token usage: {s.token_usage:.2f}, "
    )
    if s.accept_len is not None:
        msg += f"accept len: {s.accept_len:.2f}, accept rate: {s.accept_rate:.2f}, "
    if s.preallocated_usage is not None:
        msg += (
            f"pre-allocated usage: {s.preallocated_usage:.2f}, "
            f"#prealloc-req: {s.prealloc_req}, #transfer-req: {s.transfer_req}, "
        )
        if s.host_receive_req is not None:
            msg += f"#host-receive-req: {s.host_receive_req}, "
        msg += f"#retracted-req: {s.retracted_req}, "
    return msg + (
        f"cuda graph: {s.cuda_graph}, gen throughput (token/s): {s.gen_throughput:.2f}, "
        f"#queue-req: {s.queue_req}"
    )
