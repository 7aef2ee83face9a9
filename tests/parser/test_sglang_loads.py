"""The /v1/loads shape the sim's unit tests hold it to is SGLang's: LoadSnapshot.to_dict's
keys (core, then the memory, disaggregation and queue sections), read from the pinned SGLang
in the parser environment."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import CACHE, require_path
from tests.unit.test_sim_http import LOAD_CORE_KEYS, LOAD_SECTION_KEYS

pytestmark = pytest.mark.parser

SGENV = CACHE / "sglang-parser"
SNAPSHOT_KEYS = """
import json
from sglang.srt.managers import load_snapshot as ls
s = ls.LoadSnapshot(
    memory=ls.MemoryMetrics(0, 0, 0, 0),
    disaggregation=ls.DisaggregationMetrics("decode"),
    queues=ls.QueueMetrics(0, 0, 0, 0, 0),
)
d = s.to_dict({"core", "disagg", "queues", "memory"})
print(json.dumps({k: list(v) if isinstance(v, dict) else None for k, v in d.items()}))
"""


def test_sim_load_keys_are_sglangs() -> None:
    python = require_path(SGENV / "bin" / "python", "SGLang parser environment")
    out = subprocess.run(
        [str(python), "-c", SNAPSHOT_KEYS], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    keys = json.loads(out)
    assert [k for k, v in keys.items() if v is None] == LOAD_CORE_KEYS
    assert {k: v for k, v in keys.items() if v is not None} == LOAD_SECTION_KEYS
