"""pdstack.gpu: throttling, XID errors and missing GPU telemetry (pd-exporter's NVML series)."""

from __future__ import annotations

from monitoring.alerts.common import Area, Rule, label, value
from monitoring.queries import counted_from_zero, series

GROUP = "pdstack.gpu"


def rules(area: Area) -> list[Rule]:
    s, t = area.sel, area.th
    gpu_of = f"GPU {label('gpu')} ({label('role')} {label('engine')}) on {label('instance')}"
    xid = series("pdstack_gpu_xid_errors_total", s.exporter)
    return [
        # Power-cap throttling under load is normal; these reasons are not.
        area.alert(
            "PDGPUThrottling",
            "max by (instance, gpu, role, engine, reason) ("
            + series(
                "pdstack_gpu_throttle_reason",
                s.exporter,
                'reason=~"hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown|sw_thermal_slowdown"',
            )
            + ") == 1",
            t.throttle_for,
            "warning",
            "A GPU is throttled by heat or a hardware slowdown.",
            f"{gpu_of} is throttled: {label('reason')}.",
        ),
        # pd-exporter writes an XID code's series at its first event: increase() alone, which
        # needs two samples, would miss it (a lone XID 79 would never alert).
        area.alert(
            "PDGPUXidErrors",
            f"sum by (instance, gpu, role, engine, xid) {counted_from_zero(xid, '10m')} > 0",
            t.xid_for,
            "critical",
            "A GPU reported XID errors.",
            f"{gpu_of} reported XID {label('xid')} ({value('humanize')} in the last 10 minutes).",
        ),
        area.alert(
            "PDGPUTelemetryMissing",
            f"{series('pdstack_gpu_up', s.exporter)} == 0",
            t.down_for,
            "warning",
            "pd-exporter cannot read the GPUs through NVML.",
            f"NVML is unavailable on {label('instance')} (no driver, or the driver failed);"
            " GPU power, utilisation, throttling and XID metrics are missing.",
        ),
    ]
