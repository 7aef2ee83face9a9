"""A fake NVML for tests on hosts without a GPU: the pynvml surface pd-exporter uses
(pdctl/exporter/gpu.py), with planted readings, throttle reasons and XID events.

In-process tests hand a `FakeNvml` to `Nvml`. A separate exporter process imports the
stand-in `pynvml` in STANDIN_DIR instead (PYTHONPATH=STANDIN_DIR:<repo>): it serves the state
a test wrote with `write_state` to the file named by $PDSTACK_FAKE_NVML_STATE, re-read on
every call so the test can plant changes while the exporter runs. Real NVML is only exercised
on GPU hosts."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_ENV = "PDSTACK_FAKE_NVML_STATE"
STANDIN_DIR = Path(__file__).resolve().parent / "nvml_standin"
GIB = 1 << 30


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    """One GPU's readings in NVML's units (mW, MHz, KB/s, percent)."""

    uuid: str
    broken: bool = False  # every query fails (GPU fell off the bus)
    memory_used: int = 60 * GIB
    memory_total: int = 96 * GIB
    power_mw: int = 342_000
    power_limit_mw: int = 600_000
    util_gpu: int = 97
    util_memory: int = 27
    temperature_c: int = 71
    sm_clock_mhz: int = 2400
    memory_clock_mhz: int = 14000
    pcie_tx_kbps: int = 1000
    pcie_rx_kbps: int = 2000
    pcie_supported: bool = True
    throttle: int = 0  # nvmlClocksThrottleReason* bits


@dataclass
class FakeEvent:
    device: int
    eventData: int  # pynvml's field name: the XID


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    init_error: int | None = None  # nvmlInit fails with it (no driver), and so do later calls
    xids: list[FakeEvent] = field(default_factory=list)  # delivered in order, once each

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    nvmlEventTypeXidCriticalError = 8

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        if self.init_error is not None:  # the driver went away after nvmlInit
            raise NVMLError(self.init_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.gpus[index].broken:
            raise NVMLError(15)  # GPU_IS_LOST
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        gpu = self.gpus[h]
        return type("Mem", (), {"used": gpu.memory_used, "total": gpu.memory_total})

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.gpus[h].power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self.gpus[h].power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        gpu = self.gpus[h]
        return type("Util", (), {"gpu": gpu.util_gpu, "memory": gpu.util_memory})

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self.gpus[h].temperature_c

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        gpu = self.gpus[h]
        return gpu.sm_clock_mhz if clock == self.NVML_CLOCK_SM else gpu.memory_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        gpu = self.gpus[h]
        if not gpu.pcie_supported:
            raise NVMLError(3)  # NOT_SUPPORTED
        return gpu.pcie_tx_kbps if counter == self.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbps

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self.gpus[h].throttle

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, events: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> FakeEvent:
        if self.xids:
            return self.xids.pop(0)
        time.sleep(0.01)
        raise NVMLError(10)  # TIMEOUT


def write_state(path: Path, nvml: FakeNvml) -> None:
    """Plant `nvml` for the stand-in; `xids` lists every event planted so far (the stand-in
    delivers those it has not yet). Written whole, then renamed: a reader never sees half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(nvml)))
    tmp.replace(path)


def read_state(skip_xids: int) -> FakeNvml:
    """The planted state, without the first `skip_xids` events (already delivered)."""
    state = json.loads(Path(os.environ[STATE_ENV]).read_text())
    return FakeNvml(
        [FakeGpu(**gpu) for gpu in state["gpus"]],
        state["init_error"],
        [FakeEvent(**event) for event in state["xids"][skip_xids:]],
    )
