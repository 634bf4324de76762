"""The contract between a console server and whatever runs its commands.

``CommandRunner`` (threads on this machine) and ``ClusterRunner`` (a Ray
cluster) implement it over one core (``_core.RunnerCore``), so the server, its
WebSocket protocol and its metrics do not change with where commands run.
Every method is called on the server's event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from wirecut.console.commands import CommandSet, Session, Stream

if TYPE_CHECKING:
    from wirecut.console.runner._core import CommandRecord
    from wirecut.record import CompleteFacts

__all__ = ["CommandSink", "Runner", "RunnerObserver"]


class CommandSink(Protocol):
    """Where a command's news goes; every method is called on the runner's event loop.

    ``complete`` comes exactly once per accepted command, and last.
    """

    def started(self, command: CommandRecord) -> None: ...

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None: ...

    def confirm_required(self, command: CommandRecord, message: str) -> None: ...

    def complete(self, command: CommandRecord, facts: CompleteFacts) -> None: ...


class RunnerObserver(Protocol):
    """What a runner reports for metrics; called on the event loop."""

    def completed(self, facts: CompleteFacts, cancel_to_complete_ms: float | None) -> None: ...

    def output_dropped(self, characters: int) -> None: ...


class Runner(Protocol):
    """Runs a server's commands; see ``RunnerCore`` for the semantics every runner keeps."""

    #: The commands it accepts (``help`` and ``/api/commands`` list them).
    commands: CommandSet

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

    def cancel(self, command: CommandRecord, reason: str) -> bool:
        """Cancel with ``reason`` (first reason wins); False if already cancelled or done."""

    def cancel_all(self, commands: Iterable[CommandRecord], reason: str) -> int:
        """Cancel each of ``commands`` in one pass, the cuts first; how many this cancelled."""

    def confirm(self, command: CommandRecord) -> bool:
        """The client confirmed; False if the command is not waiting for a confirmation."""

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body."""

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Cancel every command with ``reason`` and return when each has its ``complete``."""
