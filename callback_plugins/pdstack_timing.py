"""Where a playbook run's time goes: wall time per task, per role and per module, and the remote
round trips.

Enabled by benchmarks/site_noop.py (ANSIBLE_CALLBACKS_ENABLED=pdstack_timing), it writes one
JSON document to PDSTACK_TIMING_FILE at the end of the run. Round trips are counted in the
forked workers, where Ansible's action plugins run: each module execution (`modules`), each
command sent over the connection (`commands`: a pipelined module is one, a module with a
temporary directory three or more) and each file transfer (`transfers`), appended as one
line per call to PDSTACK_TIMING_FILE.calls, by task and by connection target.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: pdstack_timing
    type: aggregate
    short_description: time per task and role, remote round trips per host (benchmarks)
    description:
      - Writes a JSON report to the file named by PDSTACK_TIMING_FILE (nothing when unset).
    requirements:
      - enable in configuration (callbacks_enabled = pdstack_timing)
"""

_COUNTED = {
    "modules": "_execute_module",
    "commands": "_low_level_execute_command",
    "transfers": "_transfer_file",
}


def _counting(kind: str, method: Any) -> Any:
    def counted(self: ActionBase, *args: Any, **kwargs: Any) -> Any:
        calls = os.environ.get("PDSTACK_TIMING_FILE")
        if calls:
            target = f"{self._play_context.remote_addr} ({self._connection.transport})"
            # One short O_APPEND write per call: the forked workers' lines never interleave.
            with open(f"{calls}.calls", "a") as f:
                f.write(f"{kind}\t{self._task._uuid}\t{target}\n")
        return method(self, *args, **kwargs)

    counted.__wrapped__ = method  # type: ignore[attr-defined]
    return counted


def _instrument() -> None:
    for kind, name in _COUNTED.items():
        method = getattr(ActionBase, name)
        if not hasattr(method, "__wrapped__"):
            setattr(ActionBase, name, _counting(kind, method))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pdstack_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._out = os.environ.get("PDSTACK_TIMING_FILE")
        self._tasks: list[dict[str, Any]] = []
        self._start = time.monotonic()
        if self._out:
            _instrument()

    def _close_task(self) -> None:
        if self._tasks and "seconds" not in self._tasks[-1]:
            self._tasks[-1]["seconds"] = time.monotonic() - self._tasks[-1].pop("_t0")

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close_task()
        role = task._role.get_name() if task._role else ""
        self._tasks.append(
            {
                "uuid": task._uuid,
                "name": task.get_name(),
                "role": role,
                "action": task.action,
                "_t0": time.monotonic(),
            }
        )

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close_task()

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_task()
        if not self._out:
            return
        calls: Counter[tuple[str, str, str]] = Counter()
        if os.path.exists(f"{self._out}.calls"):
            with open(f"{self._out}.calls") as f:
                calls.update(tuple(line.rstrip("\n").split("\t")) for line in f)  # type: ignore[misc]
        for task in self._tasks:
            task["calls"] = {
                kind: sum(n for (k, u, _), n in calls.items() if k == kind and u == task["uuid"])
                for kind in _COUNTED
            }
        targets = sorted({t for _, _, t in calls})
        report = {
            "seconds": time.monotonic() - self._start,
            "tasks": self._tasks,
            "calls": {
                t: {kind: sum(n for (k, _, tt), n in calls.items() if k == kind and tt == t)
                    for kind in _COUNTED}
                for t in targets
            },
        }  # fmt: skip
        with open(self._out, "w") as f:
            json.dump(report, f, indent=1)
