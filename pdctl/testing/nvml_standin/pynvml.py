"""Stand-in `pynvml` for tests on hosts without a GPU (pdctl/testing/nvml.py): every attribute
is the fake's, over the state planted in $PDSTACK_FAKE_NVML_STATE as of this call. Not a
package on purpose: only a test's PYTHONPATH puts it in front of the real nvidia-ml-py."""

from __future__ import annotations

import time
from typing import Any

from pdctl.testing.nvml import FakeEvent, NVMLError, read_state

_delivered = 0  # XID events handed out so far; the state file lists every planted one


def nvmlEventSetWait_v2(events: str, timeout_ms: int) -> FakeEvent:
    global _delivered
    try:
        event = read_state(_delivered).nvmlEventSetWait_v2(events, timeout_ms)
    except NVMLError:
        time.sleep(0.2)  # wait as NVML does, rather than re-reading the file in a busy loop
        raise
    _delivered += 1
    return event


def __getattr__(name: str) -> Any:
    return getattr(read_state(_delivered), name)
