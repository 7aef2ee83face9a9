"""GPU readings through NVML (nvidia-ml-py). Without NVML (no driver, no GPU) the reader says
so and returns nothing; a reading a GPU does not support is left out, not an error."""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from pdctl.exporter.statelog import StateLog

# nvmlClocksThrottleReason* bits (nvml.h), named as the alert rules and dashboards use them.
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


@dataclass
class GpuReading:
    index: int
    uuid: str
    values: dict[str, float] = field(default_factory=dict)  # family suffix -> value
    clocks_hz: dict[str, float] = field(default_factory=dict)  # sm | memory
    pcie_bytes_per_second: dict[str, float] = field(default_factory=dict)  # tx | rx
    throttle: dict[str, bool] = field(default_factory=dict)


def load_nvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class Nvml:
    """Initialises NVML lazily and again after a failure, so a driver loaded after the
    exporter started is picked up on a later scrape."""

    def __init__(self, module: Any, log: StateLog) -> None:
        self.nvml = module
        self.log = log
        self.ready = False
        self.xid_counts: Counter[tuple[int, int]] = Counter()
        self._xid_lock = threading.Lock()
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None

    def init(self) -> bool:
        if self.ready:
            return True
        if self.nvml is None:
            self.log.report("nvml", "nvidia-ml-py is not installed")
            return False
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            self.log.report("nvml", f"NVML unavailable: {e}")
            return False
        self.ready = True
        self.log.report("nvml", None)
        if self._xid_thread is None:
            self._start_xid_watch()
        return True

    def read(self) -> tuple[list[GpuReading], list[str]]:
        """Readings of every GPU, and the errors that lost a GPU's readings."""
        n = self.nvml
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as e:
            self.ready = False
            return [], [f"nvmlDeviceGetCount: {e}"]
        readings, errors = [], []
        for index in range(count):
            try:
                readings.append(self._read_one(index))
            except n.NVMLError as e:
                errors.append(f"GPU {index}: {e}")
        return readings, errors

    def _optional(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def _read_one(self, index: int) -> GpuReading:
        n = self.nvml
        handle = n.nvmlDeviceGetHandleByIndex(index)
        uuid = n.nvmlDeviceGetUUID(handle)
        reading = GpuReading(index, uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        memory = n.nvmlDeviceGetMemoryInfo(handle)
        reading.values["memory_used_bytes"] = float(memory.used)
        reading.values["memory_total_bytes"] = float(memory.total)
        if (power := self._optional(n.nvmlDeviceGetPowerUsage, handle)) is not None:
            reading.values["power_watts"] = power / 1000.0
        if (limit := self._optional(n.nvmlDeviceGetEnforcedPowerLimit, handle)) is not None:
            reading.values["power_limit_watts"] = limit / 1000.0
        if (util := self._optional(n.nvmlDeviceGetUtilizationRates, handle)) is not None:
            reading.values["sm_utilization_ratio"] = util.gpu / 100.0
            reading.values["memory_utilization_ratio"] = util.memory / 100.0
        temp = self._optional(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU)
        if temp is not None:
            reading.values["temperature_celsius"] = float(temp)
        for name, clock in (("sm", n.NVML_CLOCK_SM), ("memory", n.NVML_CLOCK_MEM)):
            if (mhz := self._optional(n.nvmlDeviceGetClockInfo, handle, clock)) is not None:
                reading.clocks_hz[name] = mhz * 1e6
        for name, counter in (("tx", n.NVML_PCIE_UTIL_TX_BYTES), ("rx", n.NVML_PCIE_UTIL_RX_BYTES)):
            kb = self._optional(n.nvmlDeviceGetPcieThroughput, handle, counter)
            if kb is not None:
                reading.pcie_bytes_per_second[name] = kb * 1024.0
        mask = self._optional(n.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        if mask is not None:
            reading.throttle = {r: bool(mask & bit) for r, bit in THROTTLE_REASONS.items()}
        return reading

    def _start_xid_watch(self) -> None:
        """XIDs arrive as NVML events; a thread waits for them between scrapes."""
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
            for index in range(n.nvmlDeviceGetCount()):
                handle = n.nvmlDeviceGetHandleByIndex(index)
                self._optional(
                    n.nvmlDeviceRegisterEvents, handle, n.nvmlEventTypeXidCriticalError, events
                )
        except n.NVMLError as e:
            self.log.report("xid", f"cannot watch XID events: {e}")
            return
        self._xid_thread = threading.Thread(
            target=self._watch_xids, args=(events,), name="xid-events", daemon=True
        )
        self._xid_thread.start()

    def _watch_xids(self, events: Any) -> None:
        n = self.nvml
        while not self._stop.is_set():
            try:
                data = n.nvmlEventSetWait_v2(events, 1000)
            except n.NVMLError as e:
                if getattr(e, "value", None) == NVML_ERROR_TIMEOUT:
                    continue
                self.log.report("xid", f"XID event wait failed: {e}")
                return
            index = n.nvmlDeviceGetIndex(data.device)
            with self._xid_lock:
                self.xid_counts[(index, int(data.eventData))] += 1

    def xids(self) -> dict[tuple[int, int], int]:
        with self._xid_lock:
            return dict(self.xid_counts)

    def stop(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=3)
