"""`--dist loadscope` by the lanes' work units (tests/lanes.py): the one module that uses
pytest-xdist's private API, checked against pytest-xdist 3.8.0 (pinned in pyproject.toml).

It subclasses `xdist.scheduler.LoadScopeScheduling` (xdist/scheduler/loadscope.py) and relies
on its private `_split_scope(nodeid)` (a test's unit), `_assign_work_unit(node)` (binds the
head of `workqueue`, an OrderedDict of unit -> {nodeid: done}, to a lane) and
`assigned_work` (lane -> its units). xdist's public way to group tests, `xdist_group` marks
with `--dist loadgroup`, appends the group to each worker's node ids, which pytest 9's read-only
node ids no longer let it do. After an xdist upgrade, check those three still mean this.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.lanes import Plan, module_of, next_unit


class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
    def __init__(self, config: pytest.Config, log: Any, read_plan: Callable[[], Plan]) -> None:
        super().__init__(config, log)
        self._read_plan = read_plan

    @cached_property
    def plan(self) -> Plan:
        """Read once every worker has collected: xdist schedules only then."""
        return self._read_plan()

    def _split_scope(self, nodeid: str) -> str:
        return self.plan.units[module_of(nodeid)]

    def _assign_work_unit(self, node: Any) -> None:
        pending = [u for u, tests in self.assigned_work[node].items() if not all(tests.values())]
        queue = list(self.workqueue)
        self.workqueue.move_to_end(next_unit(pending, queue, self.plan.long), last=False)
        super()._assign_work_unit(node)
