"""How the terminal shows a command: its output as it arrives, its status, its unwind.

``Renderer`` writes with rich. Output is written the moment its frame
arrives (tokens are not held back until a line is complete); ``stderr``
output goes to stderr, in red on a terminal. While a command runs with
nothing to show, a transient spinner line on stderr says what runs, for how
long, and that Ctrl+C cancels it; it disappears at the first output.

After a cancel or a timeout, ``describe_complete`` states the facts of the
``complete`` (the typed record, ``CompleteFacts``) in one line ("cancelled
· worker exited 41 ms after the cancel · 0 requests open · MCP tools/fetch
stopped · 37 tokens") and
``timeline_chart`` draws the unwind steps as bars on one time axis. A worker
that had not exited is drawn in the warning colour with what is still open:
that is the one thing never to hide.

Text that came from the server (output, an error, a note's title, a
confirmation) reaches a terminal only through ``visible``: a control
character other than newline and tab is shown as a symbol (ESC as ``␛``), so
a note titled with an escape sequence cannot write the clipboard (OSC 52),
retitle the window or clear the screen. Output going to a file or a pipe
stays byte-true.

Event loop thread only (the spinner's own refresh thread only redraws it).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.style import Style
from rich.text import Text

from wirecut.record import CompleteFacts, Reason, Status

__all__ = ["Renderer", "describe_complete", "format_ms", "timeline_chart", "visible"]

#: Seconds a command runs silently before the spinner shows (none for quick ones).
SPINNER_AFTER = 0.25
#: Width of the longest bar of the timeline chart, in cells.
BAR_WIDTH = 28

_OK = Style(color="green")
_WARN = Style(color="yellow", bold=True)
_BAD = Style(color="red", bold=True)
_DIM = Style(dim=True)
_STEP_STYLES = {
    "cancel_requested": Style(color="cyan"),
    "worker_exited": Style(color="green"),
    "escalated": Style(color="yellow"),
}


def _control_pictures() -> dict[int, str]:
    # C0 (but tab and newline) and DEL as their Unicode control pictures (U+2400
    # block: ESC is ␛); C1, which some terminals also obey (0x9B is a CSI), as
    # the replacement character. One character for one: styled spans stay put.
    table = {code: chr(0x2400 + code) for code in range(0x20) if code not in (0x09, 0x0A)}
    table[0x7F] = "\u2421"
    table.update({code: "\ufffd" for code in range(0x80, 0xA0)})
    return table


_PICTURES = _control_pictures()


def visible(text: str) -> str:
    """``text`` safe for a terminal: every control character but newline and tab shown as a symbol.

    The terminal then prints what a sequence says instead of obeying it.
    """
    return text.translate(_PICTURES)


def format_ms(ms: float) -> str:
    """``0.89 ms``, ``4.1 ms``, ``41 ms``, ``12.3 s``, ``2m 05s``: as the web page writes them.

    The page's ``fmtMs`` (static/js/dom.js) is the same rule: one number,
    written one way, on both faces.
    """
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{int(ms + 0.5)} ms"  # JavaScript's Math.round, not half to even
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, rest = divmod(int(ms // 1000), 60)
    return f"{minutes}m {rest:02d}s"


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def describe_complete(facts: CompleteFacts) -> Text:
    """The facts of a ``cancelled``, ``timeout`` or ``error`` complete, in one line.

    "worker exited 41 ms after the cancel" is the server's measure, the
    ``worker_exited`` step of the unwind timeline: the web page says the
    same, so that both faces give one number for one cancel.
    """
    status = facts.status
    lifecycle = facts.lifecycle
    steps = lifecycle.timeline or ()
    line = Text()
    if status is Status.CANCELLED and lifecycle.started is False:
        line.append("cancelled while queued", _WARN)
        line.append(" · never started")
    elif status is Status.CANCELLED:
        by = {Reason.SHUTDOWN: " by the server's shutdown", Reason.TIMEOUT: " by its timeout"}
        line.append(f"cancelled{by.get(facts.reason, '') if facts.reason else ''}", _WARN)
    elif status is Status.TIMEOUT:
        line.append("timed out", _WARN)
        line.append(f" after {format_ms(facts.elapsed_ms)}")
    else:
        line.append(visible(str(status)), _BAD)
        if facts.error:
            line.append(f": {visible(facts.error)}")
    exited = lifecycle.worker_exited
    exited_ms = next((step.ms for step in steps if step.event == "worker_exited"), None)
    line.append(" · ")
    if exited is True:
        line.append("worker exited", _OK)
        if exited_ms is not None and lifecycle.started is not False:
            line.append(f" {format_ms(exited_ms)} after the cancel")
    elif exited is None:
        line.append("worker exit unconfirmed", _WARN)
    else:
        line.append("worker still running", _BAD)
    open_requests = _int(lifecycle.open_requests)
    line.append(" · ")
    line.append(f"{_plural(open_requests, 'request')} open", _BAD if open_requests else None)
    for count, noun, plural in (
        (_int(lifecycle.open_processes), "process", "processes"),
        (_int(lifecycle.open_threads), "thread", "threads"),
    ):
        if count:
            line.append(" · ")
            line.append(f"{_plural(count, noun, plural)} open", _BAD)
    for call in facts.mcp:  # Whether each MCP server stopped the call the cancel reached.
        name = visible(f"MCP {call.server}/{call.tool}")
        line.append(" · ")
        if call.stopped is True:
            line.append(f"{name} stopped", _OK)
        elif call.stopped is False:
            line.append(f"{name} NOT stopped", _BAD)
        else:
            line.append(f"{name}: stop unconfirmed", _WARN)
    tokens = _int(facts.usage.completion_tokens)
    if tokens or _int(facts.usage.requests):
        line.append(f" · {_plural(tokens, 'token')}")
    return line


def timeline_chart(facts: CompleteFacts, *, width: int = BAR_WIDTH) -> Text | None:
    """The unwind steps of ``facts`` as bars on one axis (ms from the cancel); None if none.

    ::

        cancel requested   0.0 ms ▏
        sockets shut       0.2 ms ━━━━
        worker exited      1.4 ms ━━━━━━━━━━━━━━━━━━━━━━━━━━━━
    """
    steps = facts.lifecycle.timeline
    if not steps:
        return None
    longest = max(step.ms for step in steps)
    names = [visible(step.event.replace("_", " ")) for step in steps]
    name_width = max(len(name) for name in names)
    times = [format_ms(step.ms) for step in steps]
    time_width = max(len(t) for t in times)
    exited = facts.lifecycle.worker_exited
    chart = Text()
    for step, name, shown in zip(steps, names, times, strict=True):
        cells = round(width * step.ms / longest) if longest > 0 else 0
        style = _STEP_STYLES.get(step.event, Style(color="blue"))
        chart.append(f"  {name:<{name_width}}  {shown:>{time_width}} ", _DIM)
        chart.append("━" * cells if cells else "▏", style)
        chart.append("\n")
    if exited is not True:
        chart.append(f"  {'worker exited':<{name_width}}  {'—':>{time_width}} ", _DIM)
        chart.append("not by the time of the report" if exited is False else "unconfirmed", _BAD)
        chart.append("\n")
    return chart


class _Running:
    """The spinner's text; rendered anew at each refresh, so the elapsed time moves."""

    def __init__(self, line: str, started: float) -> None:
        self.line = line
        self.started = started
        self.cancelling = False

    def __rich__(self) -> RenderableType:
        text = Text(visible(self.line), style="bold")
        text.append(f" · {time.monotonic() - self.started:.1f} s", _DIM)
        if self.cancelling:
            text.append(" · cancelling…", _WARN)
        else:
            text.append(" · Ctrl+C cancels", _DIM)
        return text


class Renderer:
    """Shows commands on ``out`` (stdout) and ``err`` (stderr). Event loop thread only.

    ``verbose`` (the REPL) also shows a short line for a command that ended
    ``ok`` and notes such as "queued"; without it (``-c``), stdout holds the
    command's output and nothing else.
    """

    def __init__(self, out: Console, err: Console, *, verbose: bool) -> None:
        self.out = out
        self.err = err
        self.verbose = verbose
        self._at_line_start = {id(out): True, id(err): True}
        self._live: Live | None = None
        self._running: _Running | None = None
        self._spinner_handle: Any = None

    # -- one command ------------------------------------------------------------------

    def started(self, line: str, loop: Any) -> None:
        """The command began: show the spinner if it stays silent for a moment."""
        if not self.err.is_terminal:
            return
        self.pause()
        self._running = _Running(line, time.monotonic())
        self._spinner_handle = loop.call_later(SPINNER_AFTER, self._show_spinner)

    def cancelling(self) -> None:
        """This client sent a cancel: the spinner says so, or a note where none shows.

        (A command that already wrote output, or has not started yet, has no spinner.)
        """
        running = self._running
        if running is not None:
            running.cancelling = True
        if running is not None and (self._live is not None or self._spinner_handle is not None):
            if self._live is None:
                self._spinner_handle.cancel()
                self._show_spinner()
            return
        self.note("cancelling…")

    def output(self, stream: str, data: str) -> None:
        self.pause()
        if stream == "stderr":
            self._write(self.err, data, Style(color="red"))
        else:
            self._write(self.out, data, None)

    def complete(self, facts: CompleteFacts) -> None:
        """The command's last word: its status, and for a cancel or timeout the facts."""
        self.finish()
        status = facts.status
        late = facts.late_cancel
        if status is Status.OK and late:
            # Said even without -v: the user asked for a cancel and must learn
            # that the command's effect stands.
            why = {
                Reason.TIMEOUT: "its timeout came",
                Reason.SHUTDOWN: "the server's shutdown came",
            }
            self._print(
                self.err,
                Text(
                    f"done · {why.get(late, 'the cancel came')} too late: the command had "
                    "already finished",
                    _WARN,
                ),
            )
            return
        if status is Status.OK:
            if self.verbose:
                text = Text(f"ok · {format_ms(facts.elapsed_ms)}", _DIM)
                tokens = _int(facts.usage.completion_tokens)
                if tokens:
                    text.append(f" · {_plural(tokens, 'token')}", _DIM)
                self._print(self.out, text)
            return
        if status is Status.ERROR and facts.reason is None:
            error = visible(str(facts.error))
            self._print(self.err, Text.assemble(("error", _BAD), f": {error}"))
            return
        target = self.out if self.verbose else self.err
        self._print(target, describe_complete(facts))
        chart = timeline_chart(facts)
        if chart is not None:
            target.print(chart, end="", soft_wrap=True, highlight=False)

    # -- notes ----------------------------------------------------------------------

    def note(self, text: str) -> None:
        """A remark of the client's own (dim, stderr); shown in the REPL only."""
        if self.verbose:
            self.pause()
            self._print(self.err, Text(text, _DIM))

    def warn(self, text: str) -> None:
        """Something the user must see (stderr, in every mode); may quote the server."""
        self.pause()
        self._print(self.err, Text(visible(text), _WARN))

    def question(self, message: str) -> None:
        """A ``confirm_required`` message, printed as it is (many lines: a plan, a table).

        On stdout in the REPL, on stderr with ``-c`` (stdout holds only the
        command's output there). The y/N prompt comes under it.
        """
        self.pause()
        target = self.out if self.verbose else self.err
        self._print(target, Text(visible(message.rstrip("\n"))))

    def banner(self, display: str, version: str) -> None:
        line = Text.assemble(
            ("wirecut console", "bold"),
            f" {visible(version)} at {visible(display)}",
            (" · Tab completes · Ctrl+C cancels · Ctrl+D leaves · `help` lists the commands", _DIM),
        )
        self._print(self.out, line)

    # -- the spinner and the cursor ----------------------------------------------------

    def pause(self) -> None:
        """Take the spinner down (it comes back only with the next command)."""
        if self._spinner_handle is not None:
            self._spinner_handle.cancel()
            self._spinner_handle = None
        if self._live is not None:
            self._live.stop()
            self._live = None

    def finish(self) -> None:
        """The command is over: no spinner, and a terminal's cursor at the start of a line.

        Output that goes to a file or a pipe is left exactly as the command wrote it.
        """
        self.pause()
        self._running = None
        for console in (self.out, self.err):
            if console.is_terminal:
                self._ensure_newline(console)

    def _show_spinner(self) -> None:
        self._spinner_handle = None
        if self._running is None or self._live is not None:
            return
        for console in (self.out, self.err):
            if console.is_terminal:
                self._ensure_newline(console)
        self._live = Live(
            Spinner("dots", text=self._running, style="cyan"),
            console=self.err,
            transient=True,
            refresh_per_second=8,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def _write(self, console: Console, data: str, style: Style | None) -> None:
        if not data:
            return
        if console.is_terminal:
            data = visible(data)
        if console.is_terminal and style is not None:
            console.print(Text(data, style=style), end="", soft_wrap=True, highlight=False)
        else:
            # Byte-true for scripts (no markup, no wrapping, no tab expansion);
            # on a terminal, made visible above.
            console.file.write(data)
        console.file.flush()
        self._at_line_start[id(console)] = data.endswith("\n")

    def _print(self, console: Console, text: Text) -> None:
        self._ensure_newline(console)
        if self.out.is_terminal and self.err.is_terminal:
            # One screen: a line on stderr must not continue stdout's half line.
            self._ensure_newline(self.out if console is self.err else self.err)
        console.print(text, soft_wrap=True, highlight=False)
        self._at_line_start[id(console)] = True

    def _ensure_newline(self, console: Console) -> None:
        if not self._at_line_start[id(console)]:
            console.file.write("\n")
            console.file.flush()
            self._at_line_start[id(console)] = True
