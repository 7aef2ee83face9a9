"""The engine's process tree, as SGLang 0.5.23 lays it out and tears it down.

- `launch`: `entrypoints/engine.py` `Engine._launch_subprocesses` starts one
  `sglang::scheduler` process per TP (and PP) rank of this node and one
  `sglang::detokenizer`; each calls `utils/common.py` `kill_itself_when_parent_died`
  (PR_SET_PDEATHSIG = SIGKILL) and installs no SIGTERM handler, so a SIGTERM kills it at once
  and the HTTP server's death takes it along. The sim's children are forks of the HTTP
  server's process made before it starts its event loop: they import nothing and only wait
  for the shutdown request, so a start-up stays cheap. Their names are SGLang's
  (`setproctitle`, which Linux truncates to 15 bytes in /proc/PID/comm).
- `Tree.crashed`: `utils/watchdog.py` `SubprocessWatchdog._check_processes`, polled every
  1 s: a child that ended with a non-zero status is a crash.
- `Tree.shutdown`: the end of `managers/tokenizer_manager.py` `sigterm_watchdog`: a
  `ShutdownReq` to every scheduler (`scheduler.py` `handle_shutdown` ends its loop), a wait of
  up to `_SCHEDULER_EXIT_TIMEOUT_SECS` (15 s) for them, then `kill_process_tree(include_parent=
  False)`: SIGKILL to what is left (the detokenizer), reaped.
The SIGQUIT handler's `kill_process_tree` of the whole tree is `server.SimServer.sigquit`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1
SCHEDULER_EXIT_TIMEOUT_S = 15.0  # tokenizer_manager.py _SCHEDULER_EXIT_TIMEOUT_SECS
WATCHDOG_INTERVAL_S = 1.0  # SubprocessWatchdog's interval
SHUTDOWN_REQ = b"s"


@dataclass
class Child:
    name: str  # its process title
    watch_name: str  # what SubprocessWatchdog calls it: scheduler_{i}, detokenizer
    pid: int
    ask: int  # the write end of its pipe: a byte is the ShutdownReq
    status: int | None = None  # os.waitstatus_to_exitcode once reaped

    def reap(self) -> bool:
        """Whether it has ended (reaping it if it just did)."""
        if self.status is None:
            pid, raw = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(raw)
        return self.status is not None


def scheduler_names(tp_size: int, pp_size: int) -> list[str]:
    """`run_scheduler_process`'s process titles, one per rank on this node (the sim is one
    node): `sglang::scheduler` alone, else with `_PP{p}` and `_TP{t}` for sizes above 1."""
    names = []
    for pp in range(pp_size):
        for tp in range(tp_size):
            suffix = (f"_PP{pp}" if pp_size > 1 else "") + (f"_TP{tp}" if tp_size > 1 else "")
            names.append(f"sglang::scheduler{suffix}")
    return names


def _child(name: str, ask: int, siblings: list[int]) -> NoReturn:
    """A scheduler's or the detokenizer's life in the sim: dies with its parent (SIGKILL by
    PR_SET_PDEATHSIG), by SIGTERM (the default action), or exits 0 on the ShutdownReq."""
    for fd in siblings:  # the earlier children's pipes, inherited
        os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    libc.prctl(PR_SET_NAME, name.encode()[:15])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)
    try:
        os.read(ask, 1)  # the ShutdownReq, or EOF when the parent is gone
    finally:
        os._exit(0)


@dataclass
class Tree:
    children: list[Child] = field(default_factory=list)
    watching: bool = True  # SubprocessWatchdog runs until the drain stops it

    @property
    def schedulers(self) -> list[Child]:
        return [c for c in self.children if c.name.startswith("sglang::scheduler")]

    def crashed(self) -> Child | None:
        """The first child that ended with a non-zero status (SubprocessWatchdog)."""
        if not self.watching:
            return None
        return next((c for c in self.children if c.reap() and c.status != 0), None)

    def shutdown(self, log: logging.Logger) -> None:
        """The ShutdownReq, the wait for the schedulers, then SIGKILL of the rest."""
        self.watching = False
        for c in self.schedulers:
            os.write(c.ask, SHUTDOWN_REQ)
        deadline = time.monotonic() + SCHEDULER_EXIT_TIMEOUT_S
        while time.monotonic() < deadline and not all(c.reap() for c in self.schedulers):
            time.sleep(0.1)
        if stragglers := [c.pid for c in self.schedulers if not c.reap()]:
            log.warning(
                "Schedulers still alive %ds after ShutdownReq, killing them before they "
                "released: %s",
                SCHEDULER_EXIT_TIMEOUT_S,
                stragglers,
            )
        self.kill_children(log)

    def kill_children(self, log: logging.Logger) -> None:
        """kill_process_tree(os.getpid(), include_parent=False): SIGKILL and reap."""
        pid = os.getpid()
        log.info("kill_process_tree called: parent_pid=%d, include_parent=False, pid=%d", pid, pid)
        for c in self.children:
            if not c.reap():
                os.kill(c.pid, signal.SIGKILL)
                os.waitpid(c.pid, 0)
                c.status = -signal.SIGKILL


def launch(tp_size: int, pp_size: int) -> Tree:
    """Fork the schedulers and the detokenizer (before any thread or event loop exists)."""
    sys.stdout.flush()
    sys.stderr.flush()
    tree = Tree()
    schedulers = scheduler_names(tp_size, pp_size)
    titles = [*schedulers, "sglang::detokenizer"]
    watch_names = [*(f"scheduler_{i}" for i in range(len(schedulers))), "detokenizer"]
    for name, watch_name in zip(titles, watch_names, strict=True):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            _child(name, read, [c.ask for c in tree.children])
        os.close(read)
        tree.children.append(Child(name, watch_name, pid, write))
    return tree
