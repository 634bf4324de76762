"""The built-in console commands: ``help``, ``sleep``, ``jobs``, ``chat``, and the set of all.

``builtin_commands()`` is the console's own ``CommandSet``: these, and the
ones of the modules beside this one (``memory``/``curator``, ``probe``). Each
runs on a worker thread with the command's scope bound (see ``_context``).
"""

from __future__ import annotations

import math

from wirecut.agent import AIAgent, ConversationStatus
from wirecut.console.commands._context import CommandContext, CommandError
from wirecut.console.commands._memory import MEMORY_COMMANDS
from wirecut.console.commands._params import Args, Argument, Flag
from wirecut.console.commands._probe import probe
from wirecut.console.commands._registry import CommandSet, command

__all__ = ["builtin_commands"]

#: What the chat agent is told; the local model is a base model and ignores most of it.
CHAT_SYSTEM_PROMPT = "You are a helpful assistant in the wirecut console. Answer briefly."


#: The widest usage ``help`` puts beside its summary; a longer one gets a line of its own.
HELP_USAGE_COLUMN = 28


@command("help", summary="list the commands")
def help_(ctx: CommandContext, args: Args) -> None:
    # Summaries start in one column, after the usages that fit before it; a
    # longer usage gets a line of its own, its summary under it in that column.
    # (Padding every usage to the longest pushed the summaries past the width
    # of a page or a terminal, where they wrapped under the names.)
    listed = list(ctx.commands)
    width = max((len(c.usage) for c in listed if len(c.usage) <= HELP_USAGE_COLUMN), default=0)
    for found in listed:
        if len(found.usage) <= width:
            ctx.write(f"{found.usage:<{width}}  {found.summary}\n")
        else:
            ctx.write(f"{found.usage}\n{'':<{width}}  {found.summary}\n")
    if ctx.services.provider_label:
        ctx.write(f"\nprovider: {ctx.services.provider_label}\n")
    mcp = ctx.services.mcp
    if mcp is not None and len(mcp):
        ctx.write("\nMCP servers (chat offers their tools to the model):\n")
        for line in mcp.lines():
            ctx.write(f"  {line}\n")


def _seconds(word: str) -> float:
    try:
        seconds = float(word)
    except ValueError:
        raise ValueError(f"not a number: {word!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a finite number >= 0, not {word}")
    return seconds


@command(
    "sleep",
    Argument("SECONDS", convert=_seconds, missing="give a number of seconds"),
    summary="wait; for trying cancel and timeout",
)
def sleep(ctx: CommandContext, args: Args) -> None:
    ctx.scope.sleep(args["seconds"])
    ctx.write(f"slept {args['seconds']:g} s\n")


@command("jobs", summary="this connection's running and queued commands")
def jobs(ctx: CommandContext, args: Args) -> None:
    for id, line, state, elapsed_ms in ctx.session.jobs():
        ctx.write(f"{id}  {state:<9}  {elapsed_ms / 1000:7.1f} s  {line}\n")


@command(
    "chat",
    Flag("--new"),
    Argument("TEXT", rest=True, unless="--new", missing="give the text to send"),
    summary="one agent turn on the provider; streams the reply (--new: forget the history)",
)
def chat(ctx: CommandContext, args: Args) -> None:
    if args["new"]:
        with ctx.session.lock:
            ctx.session.chat_history.clear()
    if args["text"] is None:
        ctx.write("chat history cleared\n")
        return
    with ctx.session.lock:
        history = list(ctx.session.chat_history)
    mcp = ctx.services.mcp
    agent = AIAgent(
        ctx.services.chat_client(),
        model=ctx.services.model,
        system_prompt=CHAT_SYSTEM_PROMPT,
        # Each call a cancel reaches is kept for the complete's "mcp".
        tools=mcp.tools(ctx.mcp_calls) if mcp is not None else (),
        max_tokens=ctx.services.max_tokens,
    )
    result = agent.run_conversation(args["text"], history=history, on_token=ctx.token)
    ctx.add_usage(result.usage)
    if result.status is ConversationStatus.INTERRUPTED:
        ctx.scope.check()  # The command's own cancel: the runner reports it.
        raise CommandError(f"the turn was interrupted: {result.reason}")
    if result.status is not ConversationStatus.OK:
        raise CommandError(f"chat failed: {result.reason}")
    if result.final_text and not result.final_text.endswith("\n"):
        ctx.token("\n")
    with ctx.session.lock:
        ctx.session.chat_history[:] = result.messages


_BUILTINS = CommandSet([help_, sleep, jobs, chat, *MEMORY_COMMANDS, probe])


def builtin_commands() -> CommandSet:
    """The console's own commands (a value: add a host's or a test's with ``plus``)."""
    return _BUILTINS
