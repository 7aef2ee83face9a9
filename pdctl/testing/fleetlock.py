"""The fleet restart lock's server (pdctl.lockd) for tests and rehearsals, on a free local port
and stopped when the block ends: on a thread of this process (`lock_server`), or as its own
process, `pdctl lock serve` as its unit runs it (`lock_server_process`, stopped by PID)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import requests
from aiohttp import web

from pdctl import lockd, names
from pdctl.testing.stack import free_port, stop_pid, wait_until


@contextlib.contextmanager
def lock_server(
    state: Path | None = None, api_key: str | None = None, port: int | None = None
) -> Iterator[str]:
    """Serve the lock at the yielded URL; `state` keeps the lease across servers."""
    port = port or free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(lockd.app(lockd.Leases(state), api_key), access_log=None)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name=f"lock-server-{port}", daemon=True)
    thread.start()
    if not started.wait(10):
        raise TimeoutError("the lock server did not start within 10s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def lock_server_process(
    state: Path, log: Path, api_key: str | None = None, port: int | None = None
) -> Iterator[str]:
    """`pdctl lock serve` in a process of its own, logging to `log`; its URL."""
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if k != names.GATEWAY_KEY_VAR}
    if api_key:
        env[names.GATEWAY_KEY_VAR] = api_key
    argv = [sys.executable, "-c", "from pdctl.cli import main; main()", "lock", "serve",
            "--host", "127.0.0.1", "--port", str(port), "--state", str(state)]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: (
                proc.poll() is None and requests.get(f"{url}/lease", timeout=2).status_code == 200
            ),
            30,
            f"the lock server on :{port} (log {log})",
        )
        yield url
    finally:
        stop_pid(proc)
