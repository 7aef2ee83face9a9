"""Entry point: `python -m pdctl.sim <sglang.launch_server flags>`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from .args import SimConfig, resolve
from .procs import Tree, launch


async def serve(cfg: SimConfig, tree: Tree) -> int:
    """Serve until SIGTERM's drain ends (exit 0, as SGLang 0.5.20 and later exit) or SIGINT."""
    from .logs import configure, rank_prefix
    from .server import running

    a = cfg.args
    log = configure(
        a.log_level,
        rank_prefix(a.tp_size, a.dp_size, a.pp_size, a.ep_size, a.attn_cp_size, a.moe_dp_size),
    )
    for warning in cfg.warnings:
        log.warning(warning)
    if cfg.unknown:
        log.warning("pdctl.sim ignores arguments it does not model: %s", " ".join(cfg.unknown))
    loop = asyncio.get_running_loop()
    async with running(cfg, log) as server:
        server.tree = tree
        server.spawn(server.watch_children())
        drained = server.spawn(server.sigterm_watchdog())
        loop.add_signal_handler(signal.SIGTERM, server.sigterm)
        loop.add_signal_handler(signal.SIGINT, drained.cancel)
        await asyncio.gather(drained, return_exceptions=True)
    return 0


def main() -> None:
    cfg = resolve(sys.argv[1:], os.environ)
    # The children are forked before the server's modules are imported (and before any thread
    # or event loop): the pages the server later writes are then not shared copy-on-write.
    tree = launch(cfg.args.tp_size, cfg.args.pp_size)
    from .nixl_conn import SIM_PROCESS_DEFAULTS

    # Here, not where NIXL is loaded: in-process servers (tests) keep their host's environment.
    for name, value in SIM_PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)
    sys.exit(asyncio.run(serve(cfg, tree)))


if __name__ == "__main__":
    main()
