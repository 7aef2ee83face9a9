"""The `pdctl` command: one click group; each command module stays thin over plain modules."""

from __future__ import annotations

import click

from pdctl import __version__, errors
from pdctl.cli import analyze_commands, bench_commands, ops_commands, spec_commands
from pdctl.exporter.command import exporter


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


for command in [
    *spec_commands.COMMANDS,
    *analyze_commands.COMMANDS,
    *bench_commands.COMMANDS,
    *ops_commands.COMMANDS,
    exporter,
]:
    cli.add_command(command)


def main() -> None:
    errors.run(cli, "pdctl")
