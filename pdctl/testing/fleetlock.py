"""The fleet restart lock's server (pdctl.lockd) on a thread of this process, for tests and
rehearsals: the real aiohttp app on a free local port, stopped when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from pdctl import lockd
from pdctl.testing.stack import free_port


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
