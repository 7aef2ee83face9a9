"""The `pdctl` command: one click group; each command module stays thin over plain modules.

Commands load on first use (click's LazyGroup pattern), so `pdctl validate` does not import
the ops, bench and exporter stacks (aiohttp, matplotlib, prometheus_client) it never runs.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from pdctl import __version__, exits, program

# Every command in help order (pip's registry): "module:attribute" of its click command and
# its one-line summary, so `pdctl --help` imports none of them.
COMMANDS = {
    "status": ("pdctl.cli.ops_commands:status", "Every host, group, engine and gateway, at once"),
    "restart": ("pdctl.cli.ops_commands:restart", "Restart groups the safe way, or roll them"),
    "doctor": ("pdctl.cli.ops_commands:doctor", "What is wrong with the deployment, and the fix"),
    "history": ("pdctl.cli.lock_commands:history", "The fleet's restarts: who, what, how long"),
    "finish": ("pdctl.cli.finish_commands:finish", "Take up restarts a dead restarter left"),
    "recover": ("pdctl.cli.recover_command:recover", "A crashed group's restart (run by systemd)"),
    "rollout": ("pdctl.cli.rollout_commands:rollout", "Move groups to a new release, gated"),
    "roll": ("pdctl.cli.roll_commands:roll", "site.yml's config-change roll: JSON in and out"),
    "lock": ("pdctl.cli.lock_commands:lock", "Show or break the fleet restart lock"),
    "gateway": ("pdctl.cli.ops_commands:gateway", "Register groups with the gateways"),
    "etcd": ("pdctl.cli.etcd_commands:etcd", "The coordination store's members and PKI"),
    "model": ("pdctl.cli.model_commands:model", "Model revisions: manifest, verify, status"),
    "validate": ("pdctl.cli.spec_commands:validate", "Lint the deployment for PD pitfalls"),
    "plan": ("pdctl.cli.spec_commands:plan", "Per-GPU memory budget: will KV and graphs fit?"),
    "render": ("pdctl.cli.spec_commands:render", "Exact launch lines, environments and units"),
    "capacity": ("pdctl.cli.capacity_commands:capacity", "Engine counts for a workload"),
    "bench": ("pdctl.cli.bench_commands:bench", "Load the PD path and measure it"),
    "analyze": ("pdctl.cli.analyze_commands:analyze", "What the engines logged, analysed"),
    "exporter": ("pdctl.exporter.command:exporter", "Serve GPU, canary and journal metrics"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when they are looked up."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *(c for c in super().list_commands(ctx) if c not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, attr = self.lazy[cmd_name][0].split(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name][0]} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The registry's summaries, in its order, without importing a command."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in self.lazy.items()])


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=exits.epilog(),
)
@click.version_option(__version__, prog_name="pdctl")
def cli() -> None:
    """Run SGLang prefill/decode disaggregated serving on bare-metal GPU hosts.

    \b
    Typical flow:
      pdctl status                        is every group serving? (on a host, or -i/-p)
      pdctl restart --both --pair NAME    restart one group the safe way
      pdctl restart --both --all --yes    roll every group (--max-unavailable K at once)
      pdctl doctor                        what is wrong, and the command that fixes it
    Before deploying:
      pdctl validate                      lint the deployment (inventory + profile)
      pdctl plan                          per-GPU memory budget: will KV and graphs fit?
      ansible-playbook site.yml           converge the hosts
    """


def main() -> None:
    program.run(cli, "pdctl")
