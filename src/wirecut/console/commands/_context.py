"""What a console command gets: its ``CommandContext``, and the errors it may raise.

A command is a plain function ``fn(ctx, args) -> None`` made a ``Command``
value (``_registry``) and given to a runner in its ``CommandSet``. The runner
calls it on a worker thread with the command's ``InterruptScope`` bound, so
everything it starts (a provider request through ``wirecut.provider``, a
``scope.popen()`` process, a ``scope.spawn()`` thread, an agent turn)
registers with that scope and a cancel cuts it. ``print()`` inside a command
reaches the command's own ``stdout`` output; ``ctx.write()`` and
``ctx.token()`` say which stream.

Errors (the tree)::

    Exception
    └── CommandError        the command failed: ``complete`` with status "error"
        └── UsageError      the line does not fit the command's usage

``wirecut.scope.Interrupted`` (a BaseException) is not an error here: it is
the cut, and the runner reports the scope's reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from wirecut.agent import McpCalls
from wirecut.provider import DEFAULT_MAX_TOKENS, ProviderSpec
from wirecut.scope import InterruptScope

if TYPE_CHECKING:
    from wirecut.agent import McpServers
    from wirecut.console.commands._registry import CommandSet
    from wirecut.memory import NoteStore
    from wirecut.provider import Chat, Usage

__all__ = ["CommandContext", "CommandError", "Services", "Session", "Stream", "UsageError"]

Stream = Literal["stdout", "stderr", "token"]


class CommandError(Exception):
    """The command failed; the message is the one line the user sees in ``error``."""


class UsageError(CommandError):
    """The line does not fit the command: the message says what, and gives the usage."""


@dataclass
class Session:
    """What one connection keeps between its commands.

    ``chat_history`` is the conversation of ``chat`` (``chat --new`` clears
    it). Commands of one connection may run at once: take ``lock`` to change
    anything here.
    """

    chat_history: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: ``jobs`` lists these: () -> [(id, line, state, elapsed_ms)], set by the host.
    jobs: Callable[[], list[tuple[str, str, str, float]]] = lambda: []


@dataclass
class Services:
    """What the server provides to every command; shared between threads.

    ``chat_client()`` returns the configured provider's client (cuttable
    under the bound scope); ``model`` is the model name to ask for, if any;
    ``provider_label`` says which provider it is, for ``help`` and errors;
    ``mcp`` are the MCP servers whose tools agents get (``serve --mcp``),
    started and closed by the server's owner.
    """

    #: None where commands run away from the store (a cluster's command host).
    store: NoteStore | None
    chat_client: Callable[[], Chat]
    model: str | None = None
    provider_label: str = ""
    #: max_tokens for one chat reply (the local model pads until it).
    max_tokens: int = DEFAULT_MAX_TOKENS
    mcp: McpServers | None = None

    @classmethod
    def of(
        cls,
        store: NoteStore | None,
        provider: ProviderSpec,
        chat_client: Callable[[], Chat],
        *,
        mcp: McpServers | None = None,
    ) -> Services:
        """The services of a console over ``provider`` (its model, label and reply bound)."""
        return cls(store, chat_client, provider.model, provider.label, provider.max_tokens, mcp)


class CommandContext:
    """One running command: its id, line, scope, output, session, services and command set.

    Used from the command's worker thread (and from threads it started through
    the scope). ``write``, ``token`` and ``add_usage`` are safe from any of
    them; ``confirm`` blocks the calling thread until the client answers.
    ``mcp_calls`` records the command's MCP tool calls that a cancel reached
    (give it to ``services.mcp.tools()``): its ``complete`` lists them.
    """

    def __init__(
        self,
        *,
        id: str,
        line: str,
        scope: InterruptScope,
        session: Session,
        services: Services,
        output: Callable[[Stream, str], None],
        confirm: Callable[[str], bool],
        add_usage: Callable[[Usage], None],
        commands: CommandSet | None = None,
        mcp_calls: McpCalls | None = None,
    ) -> None:
        self.id = id
        self.line = line
        self.scope = scope
        self.session = session
        self.services = services
        if commands is None:
            from wirecut.console.commands._builtins import builtin_commands

            commands = builtin_commands()
        #: The commands of the runner that runs this one (``help`` lists them).
        self.commands = commands
        self.mcp_calls = mcp_calls if mcp_calls is not None else McpCalls()
        self._output = output
        self._confirm = confirm
        self._add_usage = add_usage

    def write(self, data: str, stream: Stream = "stdout") -> None:
        """Send ``data`` as output of this command (as is: add the newline yourself)."""
        self._output(stream, data)

    def token(self, data: str) -> None:
        """Send model output as it streams (``stream: "token"``)."""
        self._output("token", data)

    def confirm(self, message: str) -> bool:
        """Ask the client to confirm (``confirm_required``); True once it did.

        Blocks until the client sends ``confirm`` for this id. A cancel ends
        the wait at once with ``Interrupted``; a client that never answers is
        ended by the command's timeout.
        """
        return self._confirm(message)

    def add_usage(self, usage: Usage) -> None:
        """Count what the provider produced for this command (cut requests included)."""
        self._add_usage(usage)
