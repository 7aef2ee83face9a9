"""Run a Python script (ansible-playbook) and count the deployment's parses in it: one line, the
process id, per `pdctl.spec.load_deployment` call in the script's process or any it forks
(Ansible's workers), appended to LOG. The count rides on the audit event that call raises
(`PARSE_EVENT`), so the code measured carries no hook of its own. Used by site_noop.py:

    python benchmarks/parse_count.py LOG .venv/bin/ansible-playbook site.yml -i ...
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

# pdctl.spec.load.PARSE_EVENT, spelled here so that this wrapper imports nothing of pdctl:
# the filter plugin imports pdctl only when it parses, and so must the measured run.
PARSE_EVENT = "pdctl.spec.load_deployment"


def main() -> None:
    log, script, *args = sys.argv[1:]

    def count(event: str, _args: tuple[Any, ...]) -> None:
        if event == PARSE_EVENT:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")

    sys.addaudithook(count)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
