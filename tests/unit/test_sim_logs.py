"""pdctl.sim scheduler log lines match sglang 0.5.23's format byte for byte."""

from __future__ import annotations

import logging

from pdctl.sim.logs import (
    DecodeStats,
    PrefillStats,
    configure,
    decode_line,
    prefill_line,
    rank_prefix,
)


def test_decode_line_on_a_decode_server() -> None:
    line = decode_line(
        DecodeStats(
            running_req=57,
            num_token=20000,
            token_usage=0.0312,
            cuda_graph=True,
            gen_throughput=671.234,
            queue_req=0,
            preallocated_usage=0.0,
            prealloc_req=0,
            transfer_req=2,
            retracted_req=0,
        )
    )
    assert line == (
        "Decode batch, #running-req: 57, #token: 20000, token usage: 0.03, "
        "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 2, #retracted-req: 0, "
        "cuda graph: True, gen throughput (token/s): 671.23, #queue-req: 0"
    )


def test_decode_line_unified() -> None:
    line = decode_line(DecodeStats(3, 120, 0.5, False, 10.0, 4))
    assert line == (
        "Decode batch, #running-req: 3, #token: 120, token usage: 0.50, "
        "cuda graph: False, gen throughput (token/s): 10.00, #queue-req: 4"
    )


def test_prefill_line_on_a_prefill_server() -> None:
    line = prefill_line(
        PrefillStats(
            new_seq=2,
            new_token=512,
            cached_token=0,
            token_usage=0.01,
            running_req=0,
            queue_req=1,
            pending_token=256,
            cuda_graph=False,
            input_throughput=12345.678,
            bootstrap_req=3,
            inflight_req=2,
            optimistic_req=0,
        )
    )
    assert line == (
        "Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, token usage: 0.01, "
        "#running-req: 0, #queue-req: 1, #pending-token: 256, #bootstrap-req: 3, "
        "#inflight-req: 2, #optimistic-req: 0, cuda graph: False, "
        "input throughput (token/s): 12345.68"
    )


def test_prefix_shows_only_dimensions_above_one() -> None:
    assert rank_prefix(tp_size=1, dp_size=1, pp_size=1) == ""
    assert rank_prefix(tp_size=4, dp_size=1, pp_size=1) == " TP0"
    assert rank_prefix(tp_size=4, dp_size=2, pp_size=2) == " DP0 PP0 TP0"


def test_logger_format(capsys: object) -> None:
    log = configure("info", " TP0")
    record = logging.LogRecord("pdctl.sim", logging.INFO, __file__, 1, "hello", None, None)
    record.created = 0.0
    formatted = log.handlers[0].format(record)
    assert formatted.endswith(" TP0] hello")
    assert formatted[0] == "[" and len(formatted.split("]")[0]) == len("[1970-01-01 00:00:00 TP0")
