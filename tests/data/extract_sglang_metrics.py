"""Regenerate sglang_<version>_metrics.txt from an installed SGLang.

Run with a Python that has sglang (installed with --no-deps), torch (CPU) and
prometheus-client; the heavy model-config imports are stubbed out because only the
metric constructors are needed:

    SGVENV/bin/python tests/data/extract_sglang_metrics.py \
        > tests/data/sglang_0.5.23_metrics.txt

It instantiates the collectors SGLang creates when --enable-metrics is on (scheduler for
each disaggregation mode, tokenizer, HTTP request metrics, func timer, CPU monitor,
startup timer) and prints every family as it appears on the wire from SGLang's
multiprocess registry: counters carry `_total`, and gauges in the default multiprocess
mode ("all") carry an extra `pid` label.
"""

from __future__ import annotations

import argparse
import sys
import types
from enum import Enum
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram


class _DisaggregationMode(Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"

    @staticmethod
    def to_engine_type(mode: str) -> str:
        return {"prefill": "prefill", "decode": "decode"}.get(mode, "unified")


class _ForwardMode(Enum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4


def _stub(name: str, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


_stub("sglang.srt.disaggregation.utils", DisaggregationMode=_DisaggregationMode)
_stub("sglang.srt.model_executor.forward_batch_info", ForwardMode=_ForwardMode)

import sglang  # noqa: E402
import sglang.srt.observability.metrics_collector as mc  # noqa: E402
from sglang.srt.observability import (  # noqa: E402
    cpu_monitor,
    func_timer,
    http_request_metrics,
    startup_func_log_and_timer,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402

SOURCES = [
    "sglang/srt/observability/metrics_collector.py",
    "sglang/srt/observability/http_request_metrics.py",
    "sglang/srt/observability/func_timer.py",
    "sglang/srt/observability/cpu_monitor.py",
    "sglang/srt/observability/startup_func_log_and_timer.py",
    "sglang/srt/utils/common.py (add_prometheus_middleware: MultiProcessCollector)",
]


def _server_args(mode: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(
        ["--model-path", "/m", "--enable-metrics", "--disaggregation-mode", mode]
    )


class _Bag:
    """A config namespace: explicit overrides, then the parsed server args."""

    def __init__(self, args: argparse.Namespace, **kw: Any) -> None:
        self._args = args
        self.__dict__.update(kw)

    def __getattr__(self, key: str) -> Any:
        return getattr(self._args, key, None)


def _instantiate(mode: str) -> None:
    args = _server_args(mode)
    mc.get_observability = lambda: _Bag(args, enable_metrics=True)
    mc.get_serving = lambda: _Bag(args, served_model_name="m")
    mc.get_disagg = lambda: _Bag(args, enable_pd_role_switch=False)
    mc.get_schedule = lambda: _Bag(args, enable_priority_scheduling=False)
    mc.get_parallel = lambda: _Bag(
        args, tp_rank=0, pp_rank=0, moe_ep_rank=0, attn_tp_rank=0, attn_cp_rank=0, dp_rank=None
    )
    mc.get_context = lambda: _Bag(args, is_config_namespace_published=lambda _n: False)
    mc.exports_expert_balancedness_to_prometheus = lambda: False
    mc.SchedulerMetricsCollector.init_new(
        server_args=args,
        enable_priority_scheduling=False,
        enable_lora=False,
        enable_hierarchical_cache=False,
    )
    mc.TokenizerMetricsCollector(server_args=args, labels=mc.tokenizer_metric_labels())


def _wire(metric: Any) -> tuple[str, str, list[str], str]:
    labels = list(metric._labelnames)
    if isinstance(metric, Counter):
        return metric._name + "_total", "counter", sorted(labels), "-"
    if isinstance(metric, Gauge):
        if metric._multiprocess_mode in ("all", "liveall"):
            labels.append("pid")
        return metric._name, "gauge", sorted(labels), "-"
    if isinstance(metric, Histogram):
        bounds = ",".join(repr(float(b)) for b in metric._upper_bounds)
        return metric._name, "histogram", sorted(labels), bounds
    return metric._name, metric._type, sorted(labels), "-"


def main() -> None:
    # Each mode re-registers the same names; collect them from a fresh registry each time.
    rows: dict[str, tuple[str, str, list[str], str]] = {}
    for mode in ("null", "prefill", "decode"):
        for collector in list(REGISTRY._collector_to_names):
            if getattr(collector, "_name", "").startswith("sglang:"):
                REGISTRY.unregister(collector)
        _instantiate(mode)
        if mode == "null":
            http_request_metrics.init_http_request_metrics()
            func_timer.enable_func_timer()
            startup_func_log_and_timer.enable_startup_timer()
            cpu_monitor.start_cpu_monitor_thread("tokenizer", interval=3600)
        for collector in REGISTRY._collector_to_names:
            name = getattr(collector, "_name", "")
            if name.startswith("sglang:"):
                row = _wire(collector)
                rows[row[0]] = row
    print(f"# Prometheus families of sglang {sglang.__version__} with --enable-metrics.")
    print("# Extracted by tests/data/extract_sglang_metrics.py from:")
    for src in SOURCES:
        print(f"#   {src}")
    print("# Scheduler labels: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+dp_rank")
    print("# with --dp-size > 1); tokenizer labels: model_name, engine_type.")
    print("# A family appears on /metrics only once a labelled child has been written.")
    print("# columns: name type labels(comma-separated, sorted) histogram-buckets(or -)")
    for name in sorted(rows):
        n, t, labels, buckets = rows[name]
        print(f"{n} {t} {','.join(labels) or '-'} {buckets}")


if __name__ == "__main__":
    main()
