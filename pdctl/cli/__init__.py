"""The `pdctl` command: one click group; each command module stays thin over plain modules.

Commands load on first use (click's LazyGroup pattern), so `pdctl validate` does not import
the ops, bench and exporter stacks (aiohttp, matplotlib, prometheus_client) it never runs.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from pdctl import __version__, program

# command name -> "module:attribute" of its click command.
COMMANDS = {
    "validate": "pdctl.cli.spec_commands:validate",
    "plan": "pdctl.cli.spec_commands:plan",
    "render": "pdctl.cli.spec_commands:render",
    "status": "pdctl.cli.ops_commands:status",
    "restart": "pdctl.cli.ops_commands:restart",
    "doctor": "pdctl.cli.ops_commands:doctor",
    "recover": "pdctl.cli.ops_commands:recover",
    "finish": "pdctl.cli.finish_commands:finish",
    "gateway": "pdctl.cli.ops_commands:gateway",
    "lock": "pdctl.cli.lock_commands:lock",
    "history": "pdctl.cli.lock_commands:history",
    "etcd": "pdctl.cli.etcd_commands:etcd",
    "bench": "pdctl.cli.bench_commands:bench",
    "analyze": "pdctl.cli.analyze_commands:analyze",
    "capacity": "pdctl.cli.capacity_commands:capacity",
    "exporter": "pdctl.exporter.command:exporter",
}


class LazyGroup(click.Group):
    """A group whose commands are imported when they are looked up."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, attr = self.lazy[cmd_name].split(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
        return command


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="pdctl")
def cli() -> None:
    """Run SGLang prefill/decode disaggregated serving on bare-metal GPU hosts.

    \b
    Typical flow:
      pdctl validate              lint the deployment (inventory + profile) for PD pitfalls
      pdctl plan                  per-GPU memory budget: will the graphs and KV pool fit?
      pdctl render                exact launch lines, environments and systemd units
      ansible-playbook site.yml   converge the hosts
    """


def main() -> None:
    program.run(cli, "pdctl")
