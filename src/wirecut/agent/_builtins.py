"""The built-in tools: ``shell`` (off unless enabled), ``http_get`` and ``delegate``.

Each is made by a factory, so that what it may do is the host's decision,
not the model's: ``AIAgent(client, tools=[shell_tool(allow={"ls"}), http_get_tool()])``.
All of them block only in places a scope cuts.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import httpx

import wirecut.http
import wirecut.scope as ws
from wirecut.agent._program import run_program
from wirecut.agent._tools import Tool, ToolCallError, truncate_output
from wirecut.scope import InterruptScope

if TYPE_CHECKING:
    from wirecut.agent._agent import AIAgent

__all__ = ["delegate_tool", "http_get_tool", "shell_tool"]

#: The most of a page ``http_get`` reads: a page without end must not fill
#: the memory when the model gets 16,000 characters of it anyway.
MAX_FETCH_BYTES = 1 << 20

#: Ends the shell tool's output when a descendant left the program's process
#: group and still held the output open after the program exited.
ESCAPED_NOTE = (
    "\n[a descendant escaped the process group and still holds the output open;"
    " it was left running and its later output is not read]"
)


def shell_tool(
    *,
    allow: Collection[str] | None = None,
    cwd: str | None = None,
    timeout: float = 30.0,
    grace: float = 1.0,
) -> Tool:
    """A tool that runs a program from an argv list; never a shell string.

    ``allow`` limits the programs (``argv[0]``) the model may run; None allows
    any. The program runs in its own session through the bound scope, so a
    cut kills its whole process group (SIGTERM, SIGKILL after ``grace``), and
    so does ``timeout`` (SIGKILL). The program is over when it exits: what it
    left running in its group is killed then.

    Cancellation: the tool returns as soon as the program has exited, even if
    a descendant escaped the process group (``setsid``) and keeps the output
    pipe open; such a descendant is beyond a group kill and is left running,
    and the tool's output says so.
    """
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, not {timeout!r}")
    if not (math.isfinite(grace) and grace >= 0):
        raise ValueError(f"grace must be a finite number of seconds >= 0, not {grace!r}")

    def shell(argv: list[str], stdin: str = "") -> str:
        """Run a program and return its exit status and output.

        argv: the program and its arguments, e.g. ["ls", "-l", "/tmp"]; no shell is involved
        stdin: text to send to the program's standard input
        """
        if not argv:
            raise ToolCallError("argv must name a program")
        if allow is not None and argv[0] not in allow:
            raise ToolCallError(f"{argv[0]!r} is not allowed (allowed: {', '.join(sorted(allow))})")
        scope = ws.current_scope() or InterruptScope("shell")
        try:
            proc = scope.popen(
                argv,
                cwd=cwd,
                grace=grace,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except FileNotFoundError:
            raise ToolCallError(f"no such program: {argv[0]!r}") from None
        with proc:
            run = run_program(proc, stdin.encode(), timeout)
        # A cut kills the program, which ends the run: say why it ended.
        scope.check()
        text = truncate_output(run.output.decode(errors="replace"))
        if run.timed_out:
            report = f"error: {argv[0]} timed out after {timeout:g} s\n{text}"
        else:
            report = f"exit status {run.returncode}\n{text}"
        if run.escaped:
            report += ESCAPED_NOTE
        return report

    return Tool(shell)


def http_get_tool(
    *, timeout: float = 20.0, client_factory: Callable[[], httpx.Client] | None = None
) -> Tool:
    """A tool that fetches a URL (http or https) through ``wirecut.http``.

    The request registers with the bound scope: a cut closes it at once. At
    most ``MAX_FETCH_BYTES`` of a page are read (the connection is closed
    after that), and at most ``MAX_OUTPUT`` characters go to the model.
    """
    factory = client_factory or (lambda: wirecut.http.client(timeout=timeout))

    def http_get(url: str) -> str:
        """Fetch a web page or API endpoint with GET and return its status and text.

        url: an absolute http:// or https:// URL
        """
        if not url.startswith(("http://", "https://")):
            raise ToolCallError("url must start with http:// or https://")
        with factory() as client:
            try:
                with client.stream("GET", url, follow_redirects=True) as response:
                    body, more = _read_at_most(response, MAX_FETCH_BYTES)
                    encoding = response.encoding or "utf-8"
                    status = response.status_code
            except httpx.HTTPError as exc:
                ws.check()  # a cut surfaces as an httpx error: report the cut
                return f"error: {type(exc).__name__}: {exc}"
        text = truncate_output(body.decode(encoding, errors="replace"))
        if more:
            text += (
                f"\n[... the page is longer than {MAX_FETCH_BYTES} bytes; the rest was not read]"
            )
        return f"HTTP {status}\n{text}"

    return Tool(http_get)


def delegate_tool(
    make_agent: Callable[[], AIAgent], *, name: str = "delegate", depth: int = 1
) -> Tool:
    """A tool that hands a task to a child agent and returns its answer.

    The child runs in the caller's thread under the bound (turn) scope, so
    cutting the parent cuts the child. ``depth`` bounds how deep delegation
    may nest; the child gets no ``delegate`` tool past it.
    """
    from wirecut.agent._agent import ConversationStatus

    def delegate(task: str) -> str:
        """Hand a self-contained task to a helper agent and return its final answer.

        task: what the helper should do, with all the context it needs
        """
        child = make_agent()
        if depth > 1 and name not in child.tools:
            child.tools.add(delegate_tool(make_agent, name=name, depth=depth - 1))
        outcome = child.run_conversation(task)
        if outcome.status is ConversationStatus.INTERRUPTED:
            raise ws.Interrupted(outcome.reason or "interrupted")
        if outcome.status is not ConversationStatus.OK:
            return f"error: the helper ended with {outcome.status}: {outcome.reason}"
        return outcome.final_text

    return Tool(delegate, name=name)


def _read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of the body, and whether there was more (left unread)."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False
