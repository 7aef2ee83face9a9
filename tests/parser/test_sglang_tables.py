"""The checked-in SGLang tables are what their scripts derive from the pinned SGLang.

- tests/data/sglang_<version>_metrics.txt (every `sglang:*` family as it appears on the wire:
  type, labels, buckets) comes from tests/data/extract_sglang_metrics.py, which instantiates
  SGLang's collectors in the parser environment (it needs SGLang's imports, torch included).
- tests/data/sglang_<version>_recording.txt (who records each family: TP ranks and
  disaggregation modes) comes from tests/data/extract_sglang_recording.py, a static walk of
  that environment's SGLang source.

tests/unit/test_sim_metrics_fidelity.py and the dashboard tests check the sim and the
dashboards against the tables. A diff here means a table was edited by hand or its script
changed without regenerating it; after an SGLang bump the new tables show what moved.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys

import pytest

from tests.conftest import CACHE, ROOT, require_path

pytestmark = pytest.mark.parser

SGENV = CACHE / "sglang-parser"


@pytest.mark.parametrize(
    ("table", "header"),
    [
        ("metrics", r"# Prometheus families of sglang (\S+) with --enable-metrics\."),
        ("recording", r"# Who records each sglang:\* family in sglang (\S+)\."),
    ],
)
def test_table_matches_sglang(table: str, header: str) -> None:
    site = require_path(
        SGENV / "lib" / "python3.11" / "site-packages" / "sglang", "SGLang parser environment"
    )
    script = ROOT / "tests" / "data" / f"extract_sglang_{table}.py"
    # The metrics script imports SGLang, so it runs in the parser environment; the recording
    # script only reads SGLang's source.
    argv = (
        [str(SGENV / "bin" / "python"), str(script)]
        if table == "metrics"
        else [sys.executable, str(script), str(site)]
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
    version = re.match(header, out)
    assert version, out[:200]
    path = ROOT / "tests" / "data" / f"sglang_{version.group(1)}_{table}.txt"
    diff = "".join(
        difflib.unified_diff(
            path.read_text().splitlines(keepends=True),
            out.splitlines(keepends=True),
            str(path.relative_to(ROOT)),
            "extracted",
        )
    )
    assert not diff, (
        f"{path.relative_to(ROOT)} differs from what SGLang gives; regenerate with\n"
        f"  {' '.join(argv)} > {path}\nand review the diff:\n{diff}"
    )
