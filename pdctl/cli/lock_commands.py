"""`pdctl lock serve`: the fleet restart lock's server (pdctl.lockd)."""

from __future__ import annotations

from pathlib import Path

import click

from pdctl import names
from pdctl.ops.gateway import api_key


@click.group()
def lock() -> None:
    """The fleet restart lock: one restart at a time across every host and controller."""


@lock.command("serve")
@click.option("--host", required=True, help="Address to listen on (the first [router] host's).")
@click.option("--port", type=click.IntRange(1, 65535), default=8790, show_default=True)
@click.option(
    "--state",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path(names.LOCK_STATE_FILE),
    show_default=True,
    help="The lease is kept here, so restarting the server does not free a held lock.",
)
def serve(host: str, port: int, state: Path) -> None:
    """Serve the fleet restart lock (run by pdstack-lock.service on the first [router] host).

    One lease: `pdctl restart` and `pdctl recover` take it (owner: host and PID, what: the
    command), renew it every ttl/3 and release it. A lease not renewed within its ttl
    (router.lock_ttl_s) is taken over by the next restarter, which is told whom it replaced.
    Taking, renewing and releasing need `Authorization: Bearer` with the gateway's API key
    when PDSTACK_GATEWAY_API_KEY is set (the unit reads it from /etc/pdstack/gateway.env);
    without one there is no authentication, as for the gateway. GET /lease is open.
    """
    from pdctl import lockd  # aiohttp: only for the server

    lockd.serve(host, port, state, api_key())
