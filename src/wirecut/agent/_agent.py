"""``AIAgent``: a tool-using conversation turn that is cut as one unit.

Each ``run_conversation()`` runs in a *turn scope*: a child of the scope bound
by the host (or a scope of its own, with no host). Every request, tool thread,
subprocess and child agent of the turn registers with it, so one cancel cuts
them all: the host's ``scope.cancel()`` reaches it through the parent link,
and ``agent.interrupt()`` cancels it directly.
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import wirecut.scope as ws
from wirecut.agent._tools import Tool, ToolCallError, ToolRegistry
from wirecut.provider import Chat, ChatResult, ProviderError, ToolCall, Usage
from wirecut.scope import Interrupted, InterruptScope, bind_scope, current_scope

__all__ = ["AIAgent", "ConversationResult", "ConversationStatus"]

Message = dict[str, Any]

#: How long an interrupted turn waits for its tool threads to return.
TOOL_UNWIND_TIMEOUT = 5.0


class ConversationStatus(enum.StrEnum):
    """How a ``run_conversation()`` ended."""

    OK = "ok"  # the model gave a final answer
    INTERRUPTED = "interrupted"  # cancelled or timed out: see ``reason``
    ERROR = "error"  # the provider failed: see ``reason``
    MAX_ITERATIONS = "max_iterations"  # still calling tools after max_iterations rounds


@dataclass
class ConversationResult:
    """The outcome of one turn. ``messages`` is the whole history, this turn included."""

    status: ConversationStatus
    final_text: str
    messages: list[Message]
    usage: Usage = field(default_factory=Usage)
    reason: str | None = None
    iterations: int = 0
    #: The last model reply's ``finish_reason`` ("stop", "length" ...), None if none came.
    finish_reason: str | None = None


class _Turn:
    """What the host's scope holds for one running turn: cutting it cancels the turn."""

    __slots__ = ("scope",)

    def __init__(self, scope: InterruptScope) -> None:
        self.scope = scope

    def interrupt(self, reason: str) -> None:
        self.scope.cancel(reason)


class AIAgent:
    """An LLM agent that calls tools until it has an answer.

    ``run_conversation`` runs in the caller's thread. ``interrupt`` may be
    called from any thread, any number of times.

    Cancellation: a cancel of the bound scope, or ``interrupt()``, cuts the
    in-flight request (the provider sees the close), kills the tools'
    subprocesses, wakes their sleeps, interrupts child agents, and returns a
    result with status "interrupted"; no model call or tool call starts after
    it. Tool threads are waited for (up to ``TOOL_UNWIND_TIMEOUT``) before it
    returns.
    """

    def __init__(
        self,
        client: Chat,
        *,
        model: str | None = None,
        system_prompt: str | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        max_iterations: int = 10,
        max_parallel_tools: int = 4,
        stream: bool = True,
        **chat_params: Any,
    ) -> None:
        if max_iterations < 1:
            raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
        if max_parallel_tools < 1:
            raise ValueError(f"max_parallel_tools must be at least 1, not {max_parallel_tools}")
        self.client = client
        self.model = model
        self.system_prompt = system_prompt
        self.tools = ToolRegistry(tools)
        self.max_iterations = max_iterations
        self.max_parallel_tools = max_parallel_tools
        self.stream = stream
        self.chat_params = chat_params
        # Guards the running turns and the latched interrupt.
        self._lock = threading.Lock()
        self._turns: set[InterruptScope] = set()
        self._interrupt_reason: str | None = None

    # -- interrupting --------------------------------------------------------------

    def interrupt(self, reason: str = "interrupted") -> None:
        """Cut every running turn of this agent, and every later one until ``clear_interrupt()``.

        Idempotent (the first reason stays) and safe from any thread; it never
        blocks on the work it cuts. It works with or without a bound scope.
        """
        with self._lock:
            if self._interrupt_reason is None:
                self._interrupt_reason = reason
            turns = list(self._turns)
        for turn in turns:
            turn.cancel(reason)

    def clear_interrupt(self) -> None:
        """Let later turns run again after ``interrupt()``."""
        with self._lock:
            self._interrupt_reason = None

    @property
    def interrupted(self) -> bool:
        return self._interrupt_reason is not None

    # -- the turn ----------------------------------------------------------------------

    def run_conversation(
        self,
        user_message: str,
        *,
        history: list[Message] | None = None,
        on_token: Callable[[str], None] | None = None,
    ) -> ConversationResult:
        """Run one turn: model call, tool calls, again, until a final answer.

        ``history`` is the conversation so far (not modified); the result's
        ``messages`` is it plus this turn. Provider failures end the turn with
        status "error" and the message in ``reason``; they are not raised.
        The result's ``usage`` sums every model call of the turn, the failed
        or cut one included (``Usage.add``: an unknown count stays unknown).
        """
        messages: list[Message] = list(history or [])
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": user_message})
        usage = Usage()
        iterations = 0
        finish_reason: str | None = None

        def result(
            status: ConversationStatus, text: str = "", reason: str | None = None
        ) -> ConversationResult:
            return ConversationResult(
                status, text, messages, usage, reason, iterations, finish_reason
            )

        turn = InterruptScope("agent-turn", parent=current_scope())
        with self._lock:
            self._turns.add(turn)
            if self._interrupt_reason is not None:
                turn.cancel(self._interrupt_reason)
        try:
            # The turn is a child of the host's scope, so it is cancelled with
            # it (and born cancelled after it). Registering it as well makes
            # the running turn an object in the host's ledger, and a cancel
            # that came first raises here, before any request is sent.
            with ws.register(_Turn(turn)), bind_scope(turn):
                while True:
                    turn.check()
                    if iterations == self.max_iterations:
                        return result(ConversationStatus.MAX_ITERATIONS, reason="max_iterations")
                    iterations += 1
                    reply = self._call_model(messages, on_token)
                    usage.add(reply.usage)
                    finish_reason = reply.finish_reason
                    if reply.interrupted:
                        return result(ConversationStatus.INTERRUPTED, reply.text, reply.reason)
                    messages.append(_assistant_message(reply))
                    if not reply.tool_calls:
                        return result(ConversationStatus.OK, reply.text)
                    messages.extend(self._run_tools(turn, reply.tool_calls))
        except Interrupted as exc:
            return result(ConversationStatus.INTERRUPTED, reason=turn.reason or exc.reason)
        except ProviderError as exc:
            if exc.usage is not None:
                usage.add(exc.usage)  # What the failed call used is not lost with it.
            return result(ConversationStatus.ERROR, reason=str(exc))
        finally:
            with self._lock:
                self._turns.discard(turn)
            turn.close()

    def _call_model(
        self, messages: list[Message], on_token: Callable[[str], None] | None
    ) -> ChatResult:
        params = dict(self.chat_params)
        if self.model is not None:
            params.setdefault("model", self.model)
        return self.client.chat(
            messages,
            tools=self.tools.schemas() or None,
            stream=self.stream,
            on_token=on_token,
            **params,
        )

    def _run_tools(self, turn: InterruptScope, calls: list[ToolCall]) -> list[Message]:
        """Run the model's tool calls; several run in parallel in the turn's threads."""
        if len(calls) == 1:
            return [self._tool_message(calls[0])]
        with turn.executor(min(len(calls), self.max_parallel_tools)) as pool:
            futures = [pool.submit(self._tool_message, call) for call in calls]
            try:
                return [_result_of(future, turn) for future in futures]
            finally:
                # Interrupted or not, the turn does not return while a tool
                # thread still runs (bounded: the ledger reports the rest).
                concurrent.futures.wait(futures, TOOL_UNWIND_TIMEOUT)
                pool.shutdown(wait=False, cancel_futures=True)

    def _tool_message(self, call: ToolCall) -> Message:
        ws.check()
        try:
            content = self.tools.get(call.name).call(call.arguments)
        except ToolCallError as exc:
            content = f"error: {exc}"
        except Exception as exc:  # Interrupted is a BaseException: it passes.
            # A failing tool is news for the model, not the end of the turn.
            content = f"error: {call.name} failed: {type(exc).__name__}: {exc}"
        return {"role": "tool", "tool_call_id": call.id, "content": content}


def _result_of(future: concurrent.futures.Future[Message], turn: InterruptScope) -> Message:
    # Waits through the scope: a cancel wakes this thread at once.
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    turn.wait(done)
    return future.result()


def _assistant_message(reply: ChatResult) -> Message:
    message: Message = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
    return message
