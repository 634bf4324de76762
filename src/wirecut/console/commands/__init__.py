"""Console commands: commands as values, the command set and its parser, and the built-ins."""

from wirecut.console.commands._builtins import builtin_commands
from wirecut.console.commands._context import (
    CommandContext,
    CommandError,
    Services,
    Session,
    Stream,
    UsageError,
)
from wirecut.console.commands._registry import Command, CommandFn, CommandSet, command

__all__ = [
    "Command",
    "CommandContext",
    "CommandError",
    "CommandFn",
    "CommandSet",
    "Services",
    "Session",
    "Stream",
    "UsageError",
    "builtin_commands",
    "command",
]
