"""An engine's role in a pair or group, apart from the profile models (pdctl.spec re-exports
it): the topology and the restart path need it, and importing pdctl.spec builds every model
of the profile, which `pdctl recover` (its start-up part of a crash's time to serving again)
does not need."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
