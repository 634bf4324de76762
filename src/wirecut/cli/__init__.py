"""The ``wirecut`` command line (see ../shared/PROTOCOL.md, "Command line").

Each subcommand lives in its own module and imports its layer lazily, so that
``wirecut --help`` stays fast and a missing optional extra only affects the
subcommand that needs it. Usage errors exit 2 (click's convention, and
PROTOCOL.md's).
"""

from __future__ import annotations

import click

from wirecut import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wirecut")
def main() -> None:
    """A console for LLM-agent commands whose cancel really cancels."""


from wirecut.cli._local import local  # noqa: E402

main.add_command(local)


from wirecut.cli._provider import provider  # noqa: E402

main.add_command(provider)
