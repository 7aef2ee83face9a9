"""`python -m pdctl.sim` stops as SGLang 0.5.23 does (pdctl/sim/procs.py, docs/sim.md "Process
tree and stop"): its process tree, SIGTERM to the main process only (the engine unit's
KillMode=mixed) and SIGTERM to every process (KillMode=control-group)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from pdctl.testing.stack import SimProc, wait_until

TIMEOUT = 120  # a loaded 2-core machine decodes slowly


def children(pid: int) -> dict[int, str]:
    """The direct children of `pid`: their name in /proc (comm, 15 bytes at most)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if int(rest.split()[1]) == pid:
            found[int(entry.name)] = name
    return found


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Stream:
    """A streamed /generate of `tokens` tokens read in a thread: its data lines as they come."""

    def __init__(self, url: str, tokens: int) -> None:
        self.lines: list[str] = []
        self.error: Exception | None = None
        body = {
            "text": "x",
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
        self.thread = threading.Thread(target=self._read, args=(url, body))
        self.thread.start()

    def _read(self, url: str, body: dict[str, object]) -> None:
        try:
            with requests.post(f"{url}/generate", json=body, stream=True, timeout=TIMEOUT) as r:
                for line in r.iter_lines(decode_unicode=True):
                    if line.startswith("data: "):
                        self.lines.append(line)
        except requests.RequestException as e:
            self.error = e

    def started(self) -> bool:
        return bool(self.lines)

    def finished(self, tokens: int) -> bool:
        """All the tokens asked for, a finish reason and the end of the stream."""
        self.thread.join(TIMEOUT)
        return (
            self.error is None
            and self.lines[-1:] == ["data: [DONE]"]
            and f'"finish_reason":{{"type":"length","length":{tokens}}}' in self.lines[-2]
        )


def test_tree_is_a_scheduler_per_tp_rank_and_a_detokenizer_dying_with_the_server(
    sim_factory: Callable[..., SimProc],
) -> None:
    sim = sim_factory("null", extra=("--tp", "2")).wait_healthy()
    assert sim.proc is not None
    kids = children(sim.proc.pid)
    assert sorted(kids.values()) == ["sglang::detoken", "sglang::schedul", "sglang::schedul"]
    sim.kill(signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in kids), 5, "children gone (PR_SET_PDEATHSIG)")


def test_sigterm_to_the_server_drains_in_flight_and_new_requests_then_exits_zero(
    sim_factory: Callable[..., SimProc],
) -> None:
    """SignalHandler.sigterm_handler + sigterm_watchdog: /health and /ready 503 at once, the
    request in flight and one sent during the drain both end with all their tokens, the
    children are stopped, exit 0."""
    sim = sim_factory("null", env={"PDSIM_DRAIN_CHECK_S": "5"}).wait_healthy()
    assert sim.proc is not None
    kids = children(sim.proc.pid)
    streams = [Stream(sim.url, 1000) for _ in range(4)]
    wait_until(lambda: all(s.started() for s in streams), TIMEOUT, "first tokens")
    sim.proc.send_signal(signal.SIGTERM)
    wait_until(
        lambda: requests.get(f"{sim.url}/health", timeout=2).status_code == 503,
        TIMEOUT,
        "health 503 while draining",
        step=0.02,
    )
    assert requests.get(f"{sim.url}/ready", timeout=2).status_code == 503
    late = Stream(sim.url, 500)
    lost = [s for s in streams if not s.finished(1000)]
    print(f"SIGTERM to the main process: {len(lost)} of {len(streams)} in flight lost")
    assert not lost and late.finished(500)
    assert sim.proc.wait(TIMEOUT) == 0
    assert not any(alive(pid) for pid in kids)
    log = sim.log_text()
    assert "Draining requests and shutting down..." in log
    assert "Health check request received during shutdown. Returning 503." in log
    assert "Gracefully exiting... Remaining number of requests 5." in log
    assert "Gracefully exiting... Remaining number of requests 0." in log
    assert "crashed" not in log


def test_sigterm_to_every_process_cuts_the_request_and_ends_in_sigkill(
    sim_factory: Callable[..., SimProc],
) -> None:
    """KillMode=control-group: the schedulers die of SIGTERM, SubprocessWatchdog sees it
    within a second, SIGQUIT kills the tree: the stream ends short, status 9/KILL."""
    sim = sim_factory("null").wait_healthy()
    assert sim.proc is not None
    streams = [Stream(sim.url, 1000) for _ in range(4)]
    wait_until(lambda: all(s.started() for s in streams), TIMEOUT, "first tokens")
    for pid in [*children(sim.proc.pid), sim.proc.pid]:
        os.kill(pid, signal.SIGTERM)
    started = time.monotonic()
    assert sim.proc.wait(TIMEOUT) == -signal.SIGKILL
    assert time.monotonic() - started < 10  # SubprocessWatchdog looks every second
    lost = [s for s in streams if not s.finished(1000)]
    print(f"SIGTERM to every process: {len(lost)} of {len(streams)} in flight lost")
    assert len(lost) == len(streams)
    assert "Subprocess scheduler_0 (pid=" in sim.log_text()
    assert "crashed with exit code -15. Triggering SIGQUIT for cleanup..." in sim.log_text()


def test_an_idle_engine_stops_at_the_next_drain_check(
    sim_factory: Callable[..., SimProc],
) -> None:
    """With nothing in flight the stop waits only for sigterm_watchdog's next 5 s tick (no
    scheduler wait: 0.5.23's schedulers act on the ShutdownReq at once)."""
    env = {"PDSIM_TIME_SCALE": "1", "PDSIM_STARTUP_DELAY_S": "0", "PDSIM_DRAIN_CHECK_S": "5"}
    sim = sim_factory("null", env=env).wait_healthy()
    assert sim.proc is not None
    sim.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert sim.proc.wait(TIMEOUT) == 0
    assert time.monotonic() - started < 5 + 3
    assert "Schedulers still alive" not in sim.log_text()


def test_sgl_force_shutdown_ends_without_waiting_for_requests(
    sim_factory: Callable[..., SimProc],
) -> None:
    """sigterm_watchdog with SGL_FORCE_SHUTDOWN=1: no drain, the request in flight is lost."""
    sim = sim_factory("null", env={"SGL_FORCE_SHUTDOWN": "1"}).wait_healthy()
    assert sim.proc is not None
    stream = Stream(sim.url, 5000)
    wait_until(stream.started, TIMEOUT, "first token")
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(TIMEOUT) == 0
    assert not stream.finished(5000)
    log = sim.log_text()
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in log
    assert "Gracefully exiting..." not in log
