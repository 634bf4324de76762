"""Console commands: commands as values with their declared parameters, the command set and its
parser, and the built-ins."""

from wirecut.console.commands._builtins import builtin_commands
from wirecut.console.commands._context import (
    CommandContext,
    CommandError,
    Services,
    Session,
    Stream,
    UsageError,
)
from wirecut.console.commands._params import Args, Argument, Flag, Option, Params
from wirecut.console.commands._registry import Command, CommandFn, CommandSet, command

__all__ = [
    "Args",
    "Argument",
    "Command",
    "CommandContext",
    "CommandError",
    "CommandFn",
    "CommandSet",
    "Flag",
    "Option",
    "Params",
    "Services",
    "Session",
    "Stream",
    "UsageError",
    "builtin_commands",
    "command",
]
