"""Regenerate sglang_<version>_metrics.txt from an installed SGLang.

Run with a Python that has sglang (installed with --no-deps), torch (CPU) and
prometheus-client; the heavy model-config imports are stubbed out because only the
metric constructors are needed:

    SGVENV/bin/python tests/data/extract_sglang_metrics.py \
        > tests/data/sglang_0.5.23_metrics.txt

It instantiates the collectors SGLang creates when --enable-metrics is on (scheduler for
each disaggregation mode, tokenizer, HTTP request metrics, func timer, CPU monitor,
startup timer, the radix cache's) and prints every family as it appears on the wire from
SGLang's multiprocess registry: counters carry `_total`, and gauges in the default
multiprocess mode ("all") carry an extra `pid` label. The last column says what else a
family needs: the scheduler collector's optional blocks (--enable-lora,
--enable-hierarchical-cache, --enable-streaming-session) and the module-level families
of a transfer backend's conn.py (read from its AST: importing it needs the backend's
library), which exist in PD modes with that backend.
"""

from __future__ import annotations

import argparse
import ast
import sys
import types
from enum import Enum
from pathlib import Path
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
    "sglang/srt/disaggregation/*/conn.py (module-level families, by AST)",
]
BASE = "--enable-metrics"
# SchedulerMetricsCollector's keyword -> the flag that turns its block of families on.
SCHEDULER_OPTIONS = {
    "enable_lora": "--enable-lora",
    "enable_hierarchical_cache": "--enable-hierarchical-cache",
    "enable_streaming_session": "--enable-streaming-session",
}


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


def _instantiate(mode: str, option: str | None = None) -> None:
    """The collectors of one mode; `option`: one SCHEDULER_OPTIONS key turned on."""
    args = _server_args(mode)
    on = {key: key == option for key in SCHEDULER_OPTIONS}
    mc.get_observability = lambda: _Bag(args, enable_metrics=True)
    mc.get_serving = lambda: _Bag(
        args, served_model_name="m", enable_streaming_session=on["enable_streaming_session"]
    )
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
        enable_lora=on["enable_lora"],
        enable_hierarchical_cache=on["enable_hierarchical_cache"],
    )
    mc.TokenizerMetricsCollector(server_args=args, labels=mc.tokenizer_metric_labels())
    # base_prefix_cache.init_metrics_collector: the radix cache's own collector.
    mc.RadixCacheMetricsCollector(
        labels=mc.radix_cache_metric_labels("RadixCache", mc.get_parallel(), False)
    )


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


_CONSTRUCTORS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}


def _backend_rows() -> dict[str, tuple[str, str, list[str], str]]:
    """Module-level families of each transfer backend's conn.py, e.g. mooncake's
    FAILED_SESSION_RECOVERIES: created when the module is imported, with no labels."""
    rows: dict[str, tuple[str, str, list[str], str]] = {}
    root = Path(sglang.__file__).parent / "srt" / "disaggregation"
    for conn in sorted(root.glob("*/conn.py")):
        for node in ast.parse(conn.read_text()).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id in _CONSTRUCTORS
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and str(call.args[0].value).startswith("sglang:")
            ):
                continue
            if any(k.arg == "labelnames" for k in call.keywords) or len(call.args) > 2:
                raise SystemExit(f"{conn}: labelled module-level family, extend the reader")
            name = str(call.args[0].value)
            typ = _CONSTRUCTORS[call.func.id]
            if typ == "counter" and not name.endswith("_total"):
                name += "_total"
            flag = f"--disaggregation-transfer-backend={conn.parent.name}"
            rows[name] = (name, typ, [], "-", flag)
    return rows


def _collect(rows: dict[str, tuple[str, ...]], when: str) -> None:
    for collector in REGISTRY._collector_to_names:
        name = getattr(collector, "_name", "")
        if name.startswith("sglang:"):
            row = _wire(collector)
            rows.setdefault(row[0], (*row, when))


def _fresh_registry() -> None:
    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith("sglang:"):
            REGISTRY.unregister(collector)


def main() -> None:
    # Each mode re-registers the same names; collect them from a fresh registry each time.
    # The plain --enable-metrics collectors first, so a family's `when` is the least it needs.
    rows: dict[str, tuple[str, ...]] = {}
    for mode in ("null", "prefill", "decode"):
        _fresh_registry()
        _instantiate(mode)
        if mode == "null":
            http_request_metrics.init_http_request_metrics()
            func_timer.enable_func_timer()
            startup_func_log_and_timer.enable_startup_timer()
            cpu_monitor.start_cpu_monitor_thread("tokenizer", interval=3600)
        _collect(rows, BASE)
    for option, flag in SCHEDULER_OPTIONS.items():
        _fresh_registry()
        _instantiate("null", option)
        _collect(rows, f"{BASE},{flag}")
    for name, row in _backend_rows().items():
        rows.setdefault(name, (*row[:4], f"{BASE},{row[4]}"))
    print(f"# Prometheus families of sglang {sglang.__version__} with --enable-metrics.")
    print("# Extracted by tests/data/extract_sglang_metrics.py from:")
    for src in SOURCES:
        print(f"#   {src}")
    print("# Scheduler labels: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+dp_rank")
    print("# with --dp-size > 1); tokenizer labels: model_name, engine_type.")
    print("# A family appears on /metrics only once a labelled child has been written.")
    print("# columns: name type labels(comma-separated, sorted) histogram-buckets(or -)")
    print("#   flags(comma-separated: what SGLang needs to create the family)")
    for name in sorted(rows):
        n, t, labels, buckets, when = rows[name]
        print(f"{n} {t} {','.join(labels) or '-'} {buckets} {when}")


if __name__ == "__main__":
    main()
