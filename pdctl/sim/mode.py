"""The engine's disaggregation mode, as SGLang's `disaggregation/utils.py` DisaggregationMode.

`--disaggregation-mode` is parsed into it once (args.resolve); code compares members, never
the flag's strings.
"""

from __future__ import annotations

from enum import Enum


class DisaggregationMode(Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def is_pd(self) -> bool:
        return self is not DisaggregationMode.NULL

    @property
    def engine_type(self) -> str:
        """The metrics' `engine_type` label: a non-PD engine is "unified"."""
        return self.value if self.is_pd else "unified"
