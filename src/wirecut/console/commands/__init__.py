"""Console commands: the registry, the parser, and the built-in commands."""

from wirecut.console.commands._context import (
    CommandContext,
    CommandError,
    Services,
    Session,
    Stream,
    UsageError,
)
from wirecut.console.commands._registry import Command, CommandFn, command, commands, parse

__all__ = [
    "Command",
    "CommandContext",
    "CommandError",
    "CommandFn",
    "Services",
    "Session",
    "Stream",
    "UsageError",
    "command",
    "commands",
    "parse",
]
