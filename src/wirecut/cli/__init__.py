"""The ``wirecut`` command line (see docs/protocol.md, "Command line").

Each subcommand lives in its own module, imported only when that subcommand
runs (or ``--help`` lists it), so that ``wirecut --help`` stays fast and a
missing optional extra only affects the subcommand that needs it. Usage
errors exit 2 (click's convention, and the protocol's).
"""

from __future__ import annotations

import importlib

import click

from wirecut import __version__

# name -> "module:attribute" of its click command.
_SUBCOMMANDS = {
    "bench": "wirecut.cli._bench:bench",
    "console": "wirecut.cli._console:console",
    "doctor": "wirecut.cli._doctor:doctor",
    "local": "wirecut.cli._local:local",
    "mcp-probe": "wirecut.cli._mcp_probe:mcp_probe",
    "memory": "wirecut.cli._memory:memory",
    "provider": "wirecut.cli._provider:provider",
    "proxy": "wirecut.cli._proxy:proxy",
    "repro": "wirecut.cli._repro:repro",
    "serve": "wirecut.cli._serve:serve",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported when used (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wirecut")
def main() -> None:
    """A console for LLM-agent commands whose cancel really cancels."""
