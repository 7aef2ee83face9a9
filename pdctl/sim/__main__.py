"""Entry point: `python -m pdctl.sim <sglang.launch_server flags>`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from .args import resolve
from .logs import configure, rank_prefix
from .nixl_conn import SIM_PROCESS_DEFAULTS
from .server import running


async def serve(argv: list[str]) -> int:
    cfg = resolve(argv, os.environ)
    a = cfg.args
    log = configure(
        a.log_level,
        rank_prefix(a.tp_size, a.dp_size, a.pp_size, a.ep_size, a.attn_cp_size, a.moe_dp_size),
    )
    for warning in cfg.warnings:
        log.warning(warning)
    if cfg.unknown:
        log.warning("pdctl.sim ignores arguments it does not model: %s", " ".join(cfg.unknown))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(cfg, log):
        await stop.wait()
        log.info("Received sigterm: shutting down gracefully.")
    return 0


def main() -> None:
    # Here, not where NIXL is loaded: in-process servers (tests) keep their host's environment.
    for name, value in SIM_PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)
    sys.exit(asyncio.run(serve(sys.argv[1:])))


if __name__ == "__main__":
    main()
