"""The contract between a console server and whatever runs its commands.

``CommandRunner`` (threads on this machine) implements it; a runner that puts
the commands on a cluster implements the same, so the server, its WebSocket
protocol and its metrics do not change with where commands run. Every method
is called on the server's event loop.
"""

from __future__ import annotations

from typing import Any, Protocol

from wirecut.console.commands import Session, Stream
from wirecut.console.runner._lifecycle import CommandState

__all__ = ["CommandRecord", "CommandSink", "Runner", "RunnerObserver"]


class CommandRecord(Protocol):
    """What a server may read of an accepted command."""

    @property
    def id(self) -> str: ...

    @property
    def line(self) -> str: ...

    @property
    def accepted_at(self) -> float: ...

    @property
    def state(self) -> CommandState: ...

    @property
    def elapsed_ms(self) -> float: ...


class CommandSink(Protocol):
    """Where a command's news goes; every method is called on the runner's event loop.

    ``complete`` comes exactly once per accepted command, and last.
    """

    def started(self, command: CommandRecord) -> None: ...

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None: ...

    def confirm_required(self, command: CommandRecord, message: str) -> None: ...

    def complete(self, command: CommandRecord, facts: dict[str, Any]) -> None: ...


class RunnerObserver(Protocol):
    """What a runner reports for metrics; called on the event loop."""

    def completed(self, facts: dict[str, Any], cancel_to_complete_ms: float | None) -> None: ...

    def output_dropped(self, characters: int) -> None: ...


class Runner(Protocol):
    """Runs a server's commands; see ``CommandRunner`` for the semantics every runner keeps."""

    def start(self) -> None:
        """Bind to the running event loop, before the first ``submit``."""

    def new_id(self) -> str:
        """An id for a run frame that came without one."""

    @property
    def saturated(self) -> bool:
        """True when a command submitted now would be queued."""

    def submit(
        self,
        id: str,
        line: str,
        session: Session,
        sink: CommandSink,
        *,
        timeout: float | None = None,
    ) -> CommandRecord:
        """Accept ``line`` as command ``id``; its news goes to ``sink``."""

    def cancel(self, command: Any, reason: str) -> bool:
        """Cancel with ``reason`` (first reason wins); False if already cancelled or done."""

    def confirm(self, command: Any) -> bool:
        """The client confirmed; False if the command is not waiting for a confirmation."""

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body."""

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Cancel every command with ``reason`` and return when each has its ``complete``."""
