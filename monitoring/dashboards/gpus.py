"""GPUs and hosts: per-GPU readings by role and NUMA node (pd-exporter, NVML) and the host
(node exporter). These readings told the seed deployment its decode was latency-bound: 97% SM
busy at 57% power and 27% memory-controller load."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable

from monitoring.config import Config
from monitoring.dashboards.panels import (
    UP_THRESHOLDS,
    Panel,
    Query,
    Section,
    build_dashboard,
    query_variable,
)
from monitoring.queries import RATE_INTERVAL as RATE
from monitoring.queries import counted_from_zero, series

UID = "pdstack-gpus"
GPU_LEGEND = "{{host}} GPU {{gpu}} {{role}} NUMA {{numa_node}}"


def _gpu(title: str, description: str, unit: str, expr: str) -> Panel:
    return Panel(title, description, unit, [Query(expr, GPU_LEGEND)], width=8)


def variables(cfg: Config) -> list[QueryVariable]:
    # The hosts with GPUs are pd-exporter's (the engine hosts); node exporter runs there too,
    # and on gateway and monitoring hosts, which have no GPUs to show.
    memory = f'pdstack_gpu_memory_total_bytes{{{cfg.selectors.exporter}, host=~"$host"}}'
    hosts = series("up", cfg.selectors.exporter)
    return [
        query_variable("host", "Host", f"label_values({hosts}, host)"),
        query_variable("gpu_role", "GPU role", f"label_values({memory}, role)"),
        query_variable("numa_node", "NUMA node", f"label_values({memory}, numa_node)"),
    ]


def build(cfg: Config) -> Dashboard:
    gpu = f'{cfg.selectors.exporter}, host=~"$host", role=~"$gpu_role", numa_node=~"$numa_node"'
    node = f'{cfg.selectors.node}, host=~"$host"'
    return build_dashboard(
        UID,
        "GPUs and hosts",
        "Per-GPU power, utilisation, memory, clocks, PCIe, throttling "
        "and XID errors by role and NUMA node; host CPU, memory and network.",
        [_gpus(cfg, gpu), _hosts(node)],
        variables(cfg),
        cfg,
    )


def _gpus(cfg: Config, gpu: str) -> Section:
    return Section(
        "GPUs",
        [
            Panel(
                "NVML available",
                "1 when pd-exporter reads the GPUs through NVML; 0 on hosts "
                "without a driver or when NVML fails.",
                "none",
                [Query(f'pdstack_gpu_up{{{cfg.selectors.exporter}, host=~"$host"}}', "{{host}}")],
                kind="stat",
                width=24,
                height=4,
                thresholds=UP_THRESHOLDS,
            ),
            _gpu(
                "SM utilisation",
                "Share of time at least one kernel ran on the GPU.",
                "percentunit",
                f"pdstack_gpu_sm_utilization_ratio{{{gpu}}}",
            ),
            _gpu(
                "Memory-controller utilisation",
                "Share of time device memory was read or "
                "written; low next to high SM utilisation means latency-bound.",
                "percentunit",
                f"pdstack_gpu_memory_utilization_ratio{{{gpu}}}",
            ),
            _gpu(
                "Power vs limit",
                "Power draw as a share of the enforced power limit.",
                "percentunit",
                f"sum by (host, gpu, role, numa_node) (pdstack_gpu_power_watts{{{gpu}}}) / "
                f"sum by (host, gpu, role, numa_node) (pdstack_gpu_power_limit_watts{{{gpu}}})",
            ),
            _gpu("Power", "Power draw.", "watt", f"pdstack_gpu_power_watts{{{gpu}}}"),
            _gpu(
                "GPU memory used",
                "Device memory in use (weights, KV pool, graphs, activations).",
                "percentunit",
                f"sum by (host, gpu, role, numa_node) (pdstack_gpu_memory_used_bytes{{{gpu}}}) / "
                f"sum by (host, gpu, role, numa_node) (pdstack_gpu_memory_total_bytes{{{gpu}}})",
            ),
            _gpu(
                "Temperature",
                "GPU core temperature.",
                "celsius",
                f"pdstack_gpu_temperature_celsius{{{gpu}}}",
            ),
            _gpu(
                "SM clock",
                "Current SM clock; drops under throttling.",
                "hertz",
                f'pdstack_gpu_clock_hertz{{{gpu}, clock="sm"}}',
            ),
            _gpu(
                "PCIe throughput",
                "PCIe traffic (KV transfers between same-host prefill and "
                "decode go over PCIe without NVLink).",
                "Bps",
                f"sum by (host, gpu, role, numa_node) (pdstack_gpu_pcie_throughput_bytes_per_second"
                f"{{{gpu}}})",
            ),
            Panel(
                "Throttle reasons",
                "Active clock throttle reasons per GPU (power cap is normal "
                "under load; thermal and hardware slowdowns alert).",
                "none",
                [
                    Query(
                        f"pdstack_gpu_throttle_reason{{{gpu}}} == 1",
                        "GPU {{gpu}} {{role}} {{reason}}",
                    )
                ],
                width=8,
            ),
            Panel(
                "XID errors",
                "XID errors reported by the driver in the interval.",
                "short",
                [
                    Query(
                        "sum by (host, gpu, role, numa_node, xid) "
                        + counted_from_zero(f"pdstack_gpu_xid_errors_total{{{gpu}}}", RATE),
                        "GPU {{gpu}} {{role}} XID {{xid}}",
                    )
                ],
                width=24,
                kind="bars",
            ),
        ],
    )


def _hosts(node: str) -> Section:
    return Section(
        "Hosts",
        [
            Panel(
                "CPU busy",
                "Share of CPU time not idle, per host.",
                "percentunit",
                [
                    Query(
                        f'1 - avg by (host) (rate(node_cpu_seconds_total{{{node}, mode="idle"}}'
                        f"[{RATE}]))",
                        "{{host}}",
                    )
                ],
                width=8,
            ),
            Panel(
                "Host memory used",
                "Share of host memory not available to new allocations.",
                "percentunit",
                [
                    Query(
                        f"1 - sum by (host) (node_memory_MemAvailable_bytes{{{node}}}) / "
                        f"sum by (host) (node_memory_MemTotal_bytes{{{node}}})",
                        "{{host}}",
                    )
                ],
                width=8,
            ),
            Panel(
                "Network",
                "Bytes per second received (+) and sent (-) per host, loopback excluded.",
                "Bps",
                [
                    Query(
                        f"sum by (host) (rate(node_network_receive_bytes_total{{{node}, "
                        f'device!="lo"}}[{RATE}]))',
                        "{{host}} in",
                    ),
                    Query(
                        f"-sum by (host) (rate(node_network_transmit_bytes_total{{{node}, "
                        f'device!="lo"}}[{RATE}]))',
                        "{{host}} out",
                    ),
                ],
                width=8,
            ),
        ],
    )
