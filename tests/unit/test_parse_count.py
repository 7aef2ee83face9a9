"""benchmarks/parse_count.py: site_noop.py's count of the deployment's parses, in the process
it runs and the ones that forks (Ansible's workers), from pdctl's audit event alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pdctl.spec.load import PARSE_EVENT

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys
from pathlib import Path
from pdctl.spec import load_deployment
inventory = Path(sys.argv[1])
load_deployment(inventory)
pid = os.fork()
if pid == 0:
    load_deployment(inventory)
    os._exit(0)
os.waitpid(pid, 0)
print(os.getpid(), pid)
"""


def test_each_parse_is_one_line_with_its_process(tmp_path: Path) -> None:
    script, log = tmp_path / "script.py", tmp_path / "parses"
    script.write_text(SCRIPT)
    run = subprocess.run(
        [sys.executable, ROOT / "benchmarks/parse_count.py", log, script, ROOT / "inventory.ini"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    parent, child = run.stdout.split()
    assert log.read_text().split() == [parent, child]


def test_the_wrapper_listens_for_the_event_pdctl_raises() -> None:
    text = (ROOT / "benchmarks/parse_count.py").read_text()
    assert f'PARSE_EVENT = "{PARSE_EVENT}"' in text
