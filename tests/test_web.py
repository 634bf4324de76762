"""The web page (``wirecut serve``'s ``/``) in a real browser against a real console.

Playwright drives Debian's chromium (never a downloaded browser) against a
real ``ConsoleServer`` over the simulator, on loopback. The page keeps its
strict CSP (no ``bypass_csp``): what passes here is what a user's browser
runs, and a CSP violation or an uncaught script error fails the test. Every
wait is a bounded Playwright wait for a state of the page, never a sleep.

The simulator answers ``chat`` with a short reply (60 tokens at 40 tokens/s,
so it visibly streams and then ends), and a message containing "long" with a
reply far longer than any test waits for, to be cancelled.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from _console import Console, gate_command, running_console, wait_health
from _mcp import example, serve_http, threads_in
from _page import CHROMIUM, CHROMIUM_ARGS, run
from _support import until
from wirecut.agent import McpServers, McpServerSpec
from wirecut.console.commands import Args, CommandContext, builtin_commands, command
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.memory import NoteState, NoteStore
from wirecut.simulator import SimConfig, SimulatorServer

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshot.png"
#: Set (to anything) to write the README's screenshot; else it goes to a temporary folder.
SCREENSHOT_ENV = "WIRECUT_SCREENSHOT"
#: Milliseconds any one wait for the page may take (a shared, noisy machine).
WAIT_MS = 15_000

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)",
)

_ANSWER = (
    "Stopping the printing is the easy part of a cancel. Underneath it a worker "
    "thread is still blocked in a read, an HTTP connection is still open, and the "
    "inference server at the other end keeps decoding into a slot that nobody reads. "
    "A real cancel reaches all of them: the scope latches so that nothing new can "
    "start, every socket it owns is shut down, which wakes the blocked read and tells "
    "the provider that the client has gone, and the provider frees the slot at its "
    "next token. Only then is the command reported cancelled. "
)
_SLOT_ANSWER = (
    "llama.cpp serves a fixed number of slots, and a request holds one from its first "
    "prompt token to its last generated one. It does not stop because a browser tab "
    "stopped reading: it stops when the connection is closed and it notices, at its "
    "next token. A host that abandons a request instead of closing it leaves the slot "
    "decoding into nothing, and the next user waits in the queue behind a ghost. "
    "wirecut closes the socket at the cancel, the server sees it within a token, and "
    "the slot is free for the next request. "
)
#: About 5000 tokens each: longer than any test waits.
LONG_REPLY = _ANSWER * 60
SLOT_REPLY = _SLOT_ANSWER * 70


#: What a small base model may stream: a few words lost in a sea of whitespace.
BLANK_REPLY = "Hello\n\n\n\n\n\n   \n\t\n\n\n\nthere" + " " * 300 + "world\n" + "\n" * 400


def _responder(body: dict[str, Any]) -> Mapping[str, Any] | None:
    """A long scripted reply for a chat that asks for "long"; the usual words otherwise."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and "blank" in content:
                return {"content": BLANK_REPLY}
            if not isinstance(content, str) or "long" not in content:
                return None
            return {"content": SLOT_REPLY if "slot" in content else LONG_REPLY}
    return None


SIM = SimConfig(slots=4, tokens_per_second=40, prompt_ms=5, reply_tokens=60)


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with running_console(
        tmp_path_factory.mktemp("web"), sim=SIM, responder=_responder, max_tokens=8000
    ) as found:
        yield found


class PageProblems:
    """What the page did wrong while a test ran: script errors and CSP violations."""

    def __init__(self, page: Page) -> None:
        self.problems: list[str] = []
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text:
            self.problems.append(f"CSP: {message.text}")


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (its own storage) at a wide desktop size, dark."""
    context = browser.new_context(viewport={"width": 1200, "height": 860}, color_scheme="dark")
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    watch = PageProblems(opened)
    try:
        yield opened
    finally:
        context.close()
    assert watch.problems == []


def state_of(store: NoteStore, note_id: int) -> NoteState:
    note = store.get(note_id)
    assert note is not None
    return note.state


def open_console(page: Page, console: Console | ConsoleServer) -> None:
    server = console.server if isinstance(console, Console) else console
    page.goto(f"{server.url}?token={server.token}")
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)


def expect_state(block: Locator, state: str) -> None:
    expect(block).to_have_attribute("data-state", state, timeout=WAIT_MS)


def wait_tokens_while_running(page: Page, block: Locator, words: int) -> str:
    """Wait until ``block`` shows at least ``words`` token words while still running.

    One evaluation in the page reads both, so "the tokens were on screen
    before the command ended" is checked at one instant.
    """
    block_id = block.get_attribute("data-id")
    handle = page.wait_for_function(
        """([id, words]) => {
            const b = document.querySelector(`article.cmd[data-id="${id}"]`);
            const text = b ? [...b.querySelectorAll(".out-token")]
                .map((s) => s.textContent).join("") : "";
            const ok = b && b.dataset.state === "running"
                && text.trim().split(/\\s+/).length >= words;
            return ok ? text : null;
        }""",
        arg=[block_id, words],
        timeout=WAIT_MS,
    )
    return str(handle.json_value())


# -- tests ---------------------------------------------------------------------------


def test_token_moves_from_the_address_bar_to_session_storage(page: Page, console: Console) -> None:
    open_console(page, console)
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('wirecut.token')") == console.server.token
    page.reload()  # no token in the URL now: the page uses the one it kept
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    expect_state(run(page, "jobs"), "ok")
    # /api/health took the kept token as a Bearer header (a 401 reads "token refused").
    expect(page.locator(".hitem[data-key=busy] b")).to_have_text(re.compile(r"^\d+/4$"))


@pytest.mark.parametrize(
    ("query", "said", "notice"),
    [
        ("", "no token", "This page has no token"),
        ("?token=wrong", "token refused", "The server refused the token"),
    ],
)
def test_a_page_without_a_token_says_it_is_missing_not_refused(
    page: Page, console: Console, query: str, said: str, notice: str
) -> None:
    page.goto(console.server.url + query)
    conn = page.locator("#conn")
    expect(conn).to_have_attribute("data-state", "stopped")
    expect(page.locator("#conn-text")).to_have_text(said)
    expect(page.locator(".notice-error")).to_contain_text(notice)
    expect(page.locator(".notice-error")).to_contain_text("?token=")
    expect(page.locator("#health-items")).to_have_text(said)


def test_chat_tokens_show_while_the_reply_is_still_running(page: Page, console: Console) -> None:
    open_console(page, console)
    block = run(page, "chat hello")
    seen = wait_tokens_while_running(page, block, words=3)
    expect_state(block, "ok")
    final = "".join(block.locator(".out-token").all_text_contents())
    assert final.startswith(seen)
    assert len(final.split()) > len(seen.split())  # it kept streaming after we looked
    expect(block.locator(".cmd-foot")).to_contain_text("tokens")


def test_cancel_button_shows_the_facts_and_the_unwind_chart(page: Page, console: Console) -> None:
    open_console(page, console)
    block = run(page, "chat tell me the long story")
    wait_tokens_while_running(page, block, words=5)
    block.locator(".cmd-cancel").click()
    expect_state(block, "cancelled")
    facts = block.locator(".facts")
    expect(facts).to_have_text(
        re.compile(
            r"^cancelled · worker exited [\d.]+ m?s after the cancel · 0 requests open"
            r" · \d+ tokens$"
        )
    )
    tokens = int(re.findall(r"(\d+) tokens", facts.inner_text())[0])
    assert tokens >= 5
    expect(block.locator(".unwind")).to_be_visible()
    steps = block.locator(".unwind .step")
    events = [steps.nth(i).get_attribute("data-event") for i in range(steps.count())]
    assert events[0] == "cancel_requested"
    assert events[-1] == "worker_exited"
    assert block.locator(".unwind-leak").count() == 0
    # Nothing of it is left busy on the server (the page's health strip reads /api/health).
    expect(page.locator(".hitem[data-key=busy] b")).to_have_text("0/4", timeout=WAIT_MS)
    expect(page.locator("#jobs li")).to_have_count(0)


def test_the_page_lists_the_mcp_tools_and_says_whether_a_cut_call_stopped(
    page: Page, tmp_path: Path
) -> None:
    def ask_for_the_tool(body: dict[str, Any]) -> Mapping[str, Any] | None:
        call = {"name": "tools__wait", "arguments": {"seconds": 300}}
        return {"tool_calls": [{"function": call}]}

    with (
        serve_http(example.build()) as url,
        McpServers([McpServerSpec("tools", url)], confirm_timeout=WAIT_MS / 1000) as servers,
        SimulatorServer(SIM, responder=ask_for_the_tool) as sim,
    ):
        provider = Provider(sim.base_url, None, "simulator (tests)")
        config = ConsoleConfig(port=0, data_dir=tmp_path)
        with ConsoleServer(config, provider, mcp=servers) as console:
            open_console(page, console)
            expect(page.locator(".notice-mcp")).to_have_text(
                "MCP tools for chat — tools: fetch, run, wait"
            )
            block = run(page, "chat wait for me")
            until(lambda: bool(threads_in(example.wait)))
            block.locator(".cmd-cancel").click()
            expect_state(block, "cancelled")
            expect(block.locator(".facts")).to_contain_text(
                "0 requests open · MCP tools/wait stopped"
            )
            expect(block.locator(".facts .fact-good")).to_contain_text(["MCP tools/wait stopped"])


def test_escape_cancels_the_latest_command_and_the_keyboard_reaches_cancel(
    page: Page, console: Console
) -> None:
    open_console(page, console)
    first = run(page, "sleep 30")
    second = run(page, "sleep 31")
    third = run(page, "sleep 32")
    for block in (first, second, third):
        expect_state(block, "running")
    expect(page.locator("#jobs li")).to_have_count(3)

    page.locator("#prompt").press("Escape")
    expect_state(third, "cancelled")
    expect(third.locator(".facts")).to_contain_text("worker exited")
    expect(first).to_have_attribute("data-state", "running")
    expect(second).to_have_attribute("data-state", "running")

    # Keyboard only: Shift+Tab from the prompt lands on the latest live Cancel button.
    page.locator("#prompt").press("Shift+Tab")
    focused = page.evaluate("document.activeElement.closest('article.cmd')?.dataset.id")
    assert focused == second.get_attribute("data-id")
    page.keyboard.press("Enter")
    expect_state(second, "cancelled")
    expect(first).to_have_attribute("data-state", "running")

    page.locator("#cancel-all").click()
    expect_state(first, "cancelled")
    expect(page.locator("#jobs li")).to_have_count(0)


def test_a_worker_that_did_not_exit_is_shown_as_a_warning(page: Page, tmp_path: Path) -> None:
    # Pure Python with no cooperative point: the 1 s timeout cancels it, the
    # 0.3 s unwind bound passes with the worker still spinning (so complete
    # says so), and the escalation 2 s after the cancel finally ends it.
    with running_console(
        tmp_path, sim=SIM, command_timeout=1.0, unwind_timeout=0.3, escalate_after=2.0
    ) as slow:
        open_console(page, slow)
        block = run(page, "probe python-loop")
        expect_state(block, "timeout")
        facts = block.locator(".facts")
        expect(facts).to_have_text(re.compile(r"^timed out · worker still running · "))
        expect(facts.locator(".fact-warn")).to_have_text(["worker still running", "1 thread open"])
        chart = block.locator(".unwind.unwind-leak")
        expect(chart).to_be_visible()
        expect(chart.locator(".step").last).to_have_attribute("data-event", "worker_running")
        expect(chart.locator(".unwind-open")).to_have_text("still open: 1 thread")
        # The escalation ended it: the server counts no busy worker again.
        expect(page.locator(".hitem[data-key=busy] b")).to_have_text("0/4", timeout=WAIT_MS)


def test_confirm_writes_only_after_confirmation(page: Page, console: Console) -> None:
    store = NoteStore.in_data_dir(console.data_dir)
    old = store.add("Old idea", "unused for a year", now=time.time() - 400 * 86400)
    open_console(page, console)
    dialog = page.locator("#confirm")

    declined = run(page, "curator run")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-message")).to_contain_text(f"#{old.id}")
    assert state_of(store, old.id) is NoteState.ACTIVE
    page.keyboard.press("Escape")  # declines: a cancel for that command
    expect_state(declined, "cancelled")
    expect(dialog).to_be_hidden()
    assert state_of(store, old.id) is NoteState.ACTIVE

    # Enter typed at the prompt is not an answer: only Enter in the dialog is.
    confirmed = run(page, "curator run")
    expect(dialog).to_be_visible()
    assert page.evaluate("document.activeElement.id") == "confirm"
    assert state_of(store, old.id) is NoteState.ACTIVE
    page.keyboard.press("Enter")
    expect_state(confirmed, "ok")
    expect(confirmed.locator(".cmd-out")).to_contain_text("done:")
    assert state_of(store, old.id) is NoteState.STALE

    listed = run(page, "memory list")
    expect_state(listed, "ok")
    expect(listed.locator(".cmd-out")).to_contain_text(re.compile(rf"#{old.id}\s+stale"))


def test_bad_command_shows_its_error(page: Page, console: Console) -> None:
    open_console(page, console)
    block = run(page, "frobnicate now")
    expect_state(block, "error")
    expect(block.locator(".cmd-error")).to_contain_text("unknown command 'frobnicate'")
    usage = run(page, "sleep")
    expect_state(usage, "error")
    expect(usage.locator(".cmd-error")).to_contain_text("usage: sleep SECONDS")


def test_history_survives_a_reload_and_tab_completes_commands(page: Page, console: Console) -> None:
    open_console(page, console)
    prompt = page.locator("#prompt")
    prompt.fill("mem")
    prompt.press("Tab")
    expect(prompt).to_have_value("memory ")
    expect(page.locator("#hint-text")).to_contain_text("memory list")
    prompt.press_sequentially("l")
    prompt.press("Tab")
    expect(prompt).to_have_value("memory list ")
    prompt.press("Enter")
    expect_state(page.locator("article.cmd").last, "ok")
    prompt.fill("probe str")
    prompt.press("Tab")
    expect(prompt).to_have_value("probe stream ")
    prompt.fill("")

    page.reload()
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    prompt.press("ArrowUp")
    expect(prompt).to_have_value("memory list")
    prompt.press("ArrowDown")
    expect(prompt).to_have_value("")


def test_dropped_connection_says_its_commands_were_cancelled(page: Page, console: Console) -> None:
    routes: list[Any] = []

    def through(route: Any) -> None:
        route.connect_to_server()  # frames pass both ways; we only keep the handle
        routes.append(route)

    page.route_web_socket(re.compile(r"/api/console"), through)
    open_console(page, console)
    block = run(page, "sleep 30")
    expect_state(block, "running")

    routes[-1].close(code=4000, reason="dropped by the test")
    expect_state(block, "cancelled")
    expect(block.locator(".facts")).to_contain_text("cancelled by the disconnect")
    expect(page.locator(".notice-warn").last).to_contain_text(
        "1 command of that connection was cancelled by the disconnect"
    )
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    assert len(routes) == 2
    # The server did cancel it: its worker is free again.
    expect(page.locator(".hitem[data-key=busy] b")).to_have_text("0/4", timeout=WAIT_MS)
    expect_state(run(page, "jobs"), "ok")


def test_page_reconnects_after_the_server_restarts(page: Page, tmp_path: Path) -> None:
    with running_console(tmp_path, sim=SIM) as first:
        open_console(page, first)
        block = run(page, "sleep 30")
        expect_state(block, "running")
        port, token = first.server.port, first.server.token
        first.server.stop()
        expect_state(block, "cancelled")
        expect(block.locator(".facts")).to_contain_text("by the server's shutdown")
        conn = page.locator("#conn")
        expect(conn).to_have_attribute("data-state", re.compile("waiting|connecting"))

        provider = Provider(first.sim.base_url, None, "simulator (tests)")
        config = ConsoleConfig(port=port, data_dir=tmp_path, token=token)
        with ConsoleServer(config, provider):
            expect(page.locator("#conn")).to_have_attribute(
                "data-state", "connected", timeout=WAIT_MS
            )
            expect(page.locator(".notice-warn").last).to_contain_text("Reconnected")
            expect_state(run(page, "help"), "ok")


def test_a_press_on_a_streaming_blocks_cancel_holds_the_log_still(
    browser: Browser, console: Console
) -> None:
    # The log follows the output, which moved the Cancel button of a block
    # between the press and the release, and the tap missed: while a pointer
    # is down in the log it holds still.
    context = browser.new_context(viewport={"width": 375, "height": 740})
    context.set_default_timeout(WAIT_MS)
    try:
        page = context.new_page()
        open_console(page, console)
        expect_state(run(page, "help"), "ok")  # fills the log: it scrolls
        chat = run(page, "chat a long one please")
        words = len(wait_tokens_while_running(page, chat, words=5).split())
        button = chat.locator(".cmd-cancel")
        for _ in range(5):
            # A token may move the button between reading its place and the
            # press: then that press is let go elsewhere, and tried again.
            box = button.bounding_box()
            assert box is not None
            assert 0 <= box["y"] <= box["y"] + box["height"] <= 740, box  # on screen
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            held = button.bounding_box()
            assert held is not None
            if held["y"] <= y <= held["y"] + held["height"]:
                break
            page.mouse.move(1, 1)
            page.mouse.up()
        else:
            raise AssertionError("every press missed the moving button")
        wait_tokens_while_running(page, chat, words=words + 40)  # it kept streaming
        assert button.bounding_box() == held  # and the button did not move
        page.mouse.up()
        expect_state(chat, "cancelled")
    finally:
        context.close()


def test_phone_width_has_no_horizontal_overflow(browser: Browser, console: Console) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 740}, color_scheme="light")
    context.set_default_timeout(WAIT_MS)
    try:
        page = context.new_page()
        watch = PageProblems(page)
        open_console(page, console)
        expect_state(run(page, "help"), "ok")  # long usage lines
        long_word = run(page, "x" + "y" * 150)  # an error quoting a long unbroken word
        expect_state(long_word, "error")
        chat = run(page, "chat a long one please")
        wait_tokens_while_running(page, chat, words=5)
        # Esc, not the block's button: streaming moves the button (the log
        # follows the output), and under load a click at its old place missed.
        page.locator("#prompt").press("Escape")
        expect_state(chat, "cancelled")
        expect(chat.locator(".unwind")).to_be_visible()
        run(page, "sleep 20")  # a live chip in the status strip

        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        # Stronger than the document's width (the log clips sideways): no box sticks
        # out of the viewport and no element's content is wider than the element.
        overflowing = page.evaluate(
            """() => [...document.body.querySelectorAll("*")].filter((e) => {
                // Not counted: what is hidden, the strip's ellipsised lines, and the
                // chart's scale, whose end dots sit half past it inside their track.
                const skip = ".sr-only, [hidden], dialog:not([open]), .job-line, .step-scale";
                if (e.closest(skip)) return false;
                const r = e.getBoundingClientRect();
                // An inline box's rectangle counts the spaces that hang past a
                // wrapped line's end; its block parent is checked instead.
                if (r.width === 0 || getComputedStyle(e).display === "inline") return false;
                return r.right > innerWidth + 0.5 || r.left < -0.5
                    || (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1);
            }).map((e) => e.className || e.tagName)"""
        )
        assert overflowing == []
        page.locator("#cancel-all").click()
        assert watch.problems == []
    finally:
        context.close()


def test_screenshot_for_the_readme(page: Page, console: Console, tmp_path: Path) -> None:
    """A real session mid-flight: a cancelled chat with its facts and chart, one streaming."""
    shot = SCREENSHOT if os.environ.get(SCREENSHOT_ENV) else tmp_path / "screenshot.png"
    page.set_viewport_size({"width": 1200, "height": 800})
    open_console(page, console)
    note = run(page, "memory add Slots -- llama.cpp frees a slot when the client closes")
    expect_state(note, "ok")
    cut = run(page, "chat why must a cancel close the socket? (long answer)")
    wait_tokens_while_running(page, cut, words=40)
    page.locator("#prompt").press("Escape")  # see test_phone_width_has_no_horizontal_overflow
    expect_state(cut, "cancelled")
    expect_state(run(page, "sleep 20"), "running")
    streaming = run(page, "chat and what happens to the slot? (long answer)")
    wait_tokens_while_running(page, streaming, words=60)
    expect(page.locator(".hitem[data-key=busy] b")).to_have_text("2/4", timeout=WAIT_MS)
    page.screenshot(path=str(shot))
    assert streaming.get_attribute("data-state") == "running"
    assert shot.stat().st_size > 10_000
    page.locator("#cancel-all").click()
    expect(page.locator("#jobs li")).to_have_count(0)


def enter_then_escape(page: Page, line: str) -> None:
    """Enter and Esc in one task of the page: no frame of the server can come between."""
    page.evaluate(
        """(line) => {
            const prompt = document.getElementById("prompt");
            prompt.value = line;
            prompt.form.requestSubmit();
            prompt.dispatchEvent(new KeyboardEvent("keydown", { key: "Escape", bubbles: true }));
        }""",
        line,
    )


@pytest.mark.parametrize("keys", ["pressed", "same-task"])
def test_escape_right_after_enter_cancels_the_command(
    page: Page, console: Console, keys: str
) -> None:
    """No wait between the Enter and the Esc: not for the block, not for any frame."""
    open_console(page, console)
    prompt = page.locator("#prompt")
    if keys == "pressed":
        prompt.fill("sleep 30")
        prompt.press("Enter")
        prompt.press("Escape")
    else:
        enter_then_escape(page, "sleep 30")
    block = page.locator("article.cmd").last
    expect(block.locator(".cmd-text")).to_have_text("sleep 30")
    expect_state(block, "cancelled")
    # Cut at once, or before a worker even took it: either way nothing is left open.
    expect(block.locator(".facts")).to_have_text(
        re.compile(
            r"^cancelled (· worker exited [\d.]+ m?s after the cancel|while queued · never started)"
            r" · 0 requests open · 0 tokens$"
        )
    )
    report = wait_health(console.server, lambda h: h["workers"]["busy"] == 0)
    assert (report["workers"]["busy"], report["workers"]["queued"]) == (0, 0)


def test_escape_before_any_answer_cancels_the_queued_line(page: Page, tmp_path: Path) -> None:
    """One worker, busy: the line waits in the queue, and Esc right after Enter cancels it."""
    with running_console(tmp_path, sim=SIM, workers=1) as one:
        open_console(page, one)
        busy = run(page, "sleep 30")
        expect_state(busy, "running")
        enter_then_escape(page, "sleep 31")  # before its accepted (queued: true) came
        queued = page.locator("article.cmd").last
        expect_state(queued, "cancelled")
        expect(queued.locator(".facts")).to_have_text(
            re.compile(r"^cancelled while queued · never started · ")
        )
        expect(busy).to_have_attribute("data-state", "running")
        report = wait_health(one.server, lambda h: h["workers"]["queued"] == 0)
        assert (report["workers"]["busy"], report["workers"]["queued"]) == (1, 0)
        page.locator("#cancel-all").click()
        expect_state(busy, "cancelled")


def test_streamed_whitespace_never_fills_the_screen(page: Page, console: Console) -> None:
    open_console(page, console)
    block = run(page, "chat blank lines please")
    expect_state(block, "ok")
    shown = "".join(block.locator(".out-token").all_text_contents())
    assert shown.split() == ["Hello", "there", "world"]
    assert "\n\n\n" not in shown  # a run of blank lines shows as one
    assert not shown.startswith("\n")
    assert " " * 17 not in shown  # and a run of spaces is cut
    # On screen: a few lines, not a screen of nothing.
    height = block.locator(".cmd-out").evaluate("e => e.getBoundingClientRect().height")
    line = block.locator(".cmd-out").evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
    assert height <= 6 * line


def test_an_error_is_shown_once_in_its_block(page: Page, console: Console) -> None:
    open_console(page, console)
    block = run(page, "frobnicate now")
    expect_state(block, "error")
    expect(block.locator(".cmd-error")).to_have_count(1)
    # An error frame for a live command and then its complete with the same
    # message (the page's own block, driven by the frames it would get).
    boxes = page.evaluate(
        """async () => {
            const { CommandBlock } = await import("./static/js/block.js");
            const b = new CommandBlock("x1", "probe", { onCancel() {}, label: (e) => e });
            b.fire("accepted");
            b.addError("the provider failed");
            b.finish({ status: "error", error: "the provider failed", elapsed_ms: 1 });
            const printed = new CommandBlock("x2", "probe", { onCancel() {}, label: (e) => e });
            printed.fire("accepted");
            printed.append("stderr", "the provider failed\\n");
            printed.finish({ status: "error", error: "the provider failed", elapsed_ms: 1 });
            return [b, printed].map((x) => x.el.root.querySelectorAll(".cmd-error").length);
        }"""
    )
    assert boxes == [1, 0]


def test_an_ok_block_says_when_its_cancel_came_too_late(page: Page, console: Console) -> None:
    open_console(page, console)
    texts = page.evaluate(
        """async () => {
            const { CommandBlock } = await import("./static/js/block.js");
            const make = (id, late) => {
                const hooks = { onCancel() {}, label: (e) => e };
                const b = new CommandBlock(id, "memory add a -- b", hooks);
                b.fire("accepted");
                b.finish({ status: "ok", reason: null, late_cancel: late, elapsed_ms: 2 });
                const line = b.el.root.querySelector(".late-cancel");
                return [b.el.badge.dataset.state, line ? line.textContent : null];
            };
            return [make("y1", "user"), make("y2", null)];
        }"""
    )
    assert texts[0][0] == texts[1][0] == "ok"  # the badge follows the status
    assert "came too late" in texts[0][1]
    assert texts[1][1] is None


def test_an_unknown_transition_is_an_error_naming_state_and_event(
    page: Page, console: Console
) -> None:
    open_console(page, console)
    found = page.evaluate(
        """async () => {
            const m = await import("./static/js/lifecycle.js");
            const tried = [];
            for (const [state, event] of [["ok", "started"], ["sending", "confirmed"]]) {
                try {
                    m.transition("c7", state, event);
                    tried.push("allowed");
                } catch (error) {
                    tried.push(`${error.name}: ${error.message}`);
                }
            }
            // Every live state ends with each status and with a dropped connection.
            const endings = ["complete_ok", "complete_error", "complete_cancelled",
                "complete_timeout", "disconnected"];
            const missing = [...m.LIVE_STATES].flatMap((state) => endings
                .filter((event) => !m.TRANSITIONS.get(state).has(event))
                .map((event) => `${state}+${event}`));
            return { tried, missing, unknownStatus: m.completeEvent("exploded") };
        }"""
    )
    assert found["tried"] == [
        'LifecycleError: command "c7": event "started" is not allowed in state "ok"',
        'LifecycleError: command "c7": event "confirmed" is not allowed in state "sending"',
    ]
    assert found["missing"] == []
    assert found["unknownStatus"] == "complete_error"


def test_commands_and_timeline_labels_come_from_the_server(page: Page, console: Console) -> None:
    """A command and a label that only the server's /api/commands knows reach Tab and the chart."""

    def amended(route: Any) -> None:
        catalog = route.fetch().json()
        catalog["commands"].append(
            {"name": "frobnicate", "usage": "frobnicate [--hard] THING", "summary": "new"}
        )
        catalog["timeline"]["worker_exited"] = "worker returned (the server's words)"
        route.fulfill(json=catalog)

    page.route(re.compile(r"/api/commands$"), amended)
    open_console(page, console)
    prompt = page.locator("#prompt")
    prompt.fill("frob")
    prompt.press("Tab")
    expect(prompt).to_have_value("frobnicate ")
    prompt.press_sequentially("--h")
    prompt.press("Tab")
    expect(prompt).to_have_value("frobnicate --hard ")
    prompt.fill("curator run --stale")  # a flag that takes a value, from the usage line
    prompt.press("Tab")
    expect(prompt).to_have_value("curator run --stale-days ")
    prompt.fill("")
    block = run(page, "sleep 30")
    expect_state(block, "running")
    block.locator(".cmd-cancel").click()
    expect_state(block, "cancelled")
    expect(block.locator(".unwind .step[data-event=worker_exited] .step-name")).to_have_text(
        "worker returned (the server's words)"
    )


def _consolidation_plan(body: dict[str, Any]) -> Mapping[str, Any] | None:
    plan = {
        "umbrellas": [
            {
                "title": f"Umbrella {k} over notes {2 * k - 1} and {2 * k}",
                "summary": f"The two notes of pair {k}.",
                "note_ids": [2 * k - 1, 2 * k],
            }
            for k in range(1, 11)
        ]
    }
    return {"content": json.dumps(plan)}


def test_a_long_confirmation_is_preformatted_and_scrolls_inside_the_dialog(
    page: Page, tmp_path: Path
) -> None:
    page.set_viewport_size({"width": 800, "height": 420})
    with running_console(tmp_path, sim=SIM, responder=_consolidation_plan) as planned:
        store = NoteStore.in_data_dir(planned.data_dir)
        for k in range(1, 21):
            store.add(f"Note {k}", f"body {k}")
        open_console(page, planned)
        block = run(page, "curator run --consolidate")
        dialog = page.locator("#confirm")
        # The scripted plan streams ten umbrellas at the simulator's 40 tokens/s.
        expect(dialog).to_be_visible(timeout=2 * WAIT_MS)
        message = dialog.locator("#confirm-message")
        lines = message.inner_text().splitlines()
        for k in range(1, 11):  # each umbrella on a line of its own, as the server wrote it
            assert sum(f"Umbrella {k} over" in line for line in lines) == 1
        style = message.evaluate(
            """e => ({ space: getComputedStyle(e).whiteSpace,
                       overflow: getComputedStyle(e).overflowY,
                       scrolls: e.scrollHeight > e.clientHeight,
                       bottom: e.closest("dialog").getBoundingClientRect().bottom })"""
        )
        assert style["space"] == "pre"
        assert style["overflow"] == "auto"
        assert style["scrolls"]  # taller than the dialog allows: it scrolls inside
        assert style["bottom"] <= 420  # and the dialog, its buttons too, stays on screen
        expect(dialog.locator("#confirm-yes")).to_be_in_viewport()
        # In the block, the question starts a line of its own after the streamed plan.
        shown = block.locator(".cmd-out").text_content() or ""
        assert re.search(r"\}\n+curator run will:", shown), shown[-300:]
        page.keyboard.press("Enter")
        expect_state(block, "ok")
        assert sum(1 for note in store.notes() if note.state is NoteState.ARCHIVED) == 20


#: A plan's table as the curator writes it with summaries: new note, summary, archives.
_WIDE_PLAN = (
    "curator run will:\n  create 2 umbrella notes holding a summary and the text:\n"
    + "\n".join(
        f"    {title:<40}  {summary:<44}  {archived}"
        for title, summary, archived in [
            ("new note", "summary", "archives"),
            (
                "Sourdough starter: feeding and rising",
                "Feed it twice a day at 1:1:1 by weight…",
                "#1 Sourdough starter feeding schedule",
            ),
            ("", "", "#2 Sourdough starter rising in the cold"),
            (
                "Bike: tyres and chain",
                "Tyres at 4.5 bar; chain waxed every 300 km…",
                "#3 Bike tyre pressure for the long ride",
            ),
        ]
    )
)


@command("test-ask-wide", summary="(tests) asks with a plan's wide table")
def _ask_wide(ctx: CommandContext, args: Args) -> None:
    ctx.confirm(_WIDE_PLAN)


def test_a_wide_plan_is_shown_whole_in_the_confirmation_dialog(page: Page, tmp_path: Path) -> None:
    # The archives column is what the README tells the reader to check: a
    # dialog of a fixed 46rem (736 px) cut it off on a 1200 px screen.
    commands = builtin_commands().plus(_ask_wide)
    with running_console(tmp_path, sim=SIM, commands=commands) as served:
        open_console(page, served)
        block = run(page, "test-ask-wide")
        dialog = page.locator("#confirm")
        expect(dialog).to_be_visible()
        fit = dialog.locator("#confirm-message").evaluate(
            """e => ({ clipped: e.scrollWidth > e.clientWidth,
                       right: e.closest("dialog").getBoundingClientRect().right })"""
        )
        assert not fit["clipped"]  # every column on screen, no sideways scroll
        assert fit["right"] <= 1200
        page.keyboard.press("Escape")
        expect_state(block, "cancelled")


def test_an_escape_that_crosses_its_commands_end_shows_nothing_other_errors_show(
    page: Page, tmp_path: Path
) -> None:
    """The server answers a cancel that came after the complete with an error naming the id
    in "ref": the user pressed Esc as the command ended, which is not news.

    The WebSocket route passes frames as they are, except that it keeps the
    page's cancel until the command's complete has passed, as if the two had
    crossed on the wire (a slow uplink).
    """
    opened = threading.Event()
    down: list[dict[str, Any]] = []
    routes: list[Any] = []

    def late_cancels(route: Any) -> None:
        server = route.connect_to_server()
        routes.append(server)
        held: dict[str, str] = {}
        completed: set[str] = set()

        def up(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "cancel" and frame.get("id") not in completed:
                held[frame["id"]] = str(message)
            else:
                server.send(message)

        def back(message: str | bytes) -> None:
            frame = json.loads(message)
            down.append(frame)
            route.send(message)
            if frame.get("type") == "complete":
                completed.add(frame["id"])
                if frame["id"] in held:
                    server.send(held.pop(frame["id"]))

        route.on_message(up)
        server.on_message(back)

    commands = builtin_commands().plus(gate_command(opened))
    with running_console(tmp_path, sim=SIM, commands=commands) as gated:
        page.route_web_socket(re.compile(r"/api/console"), late_cancels)
        open_console(page, gated)
        block = run(page, "test-gate")
        expect_state(block, "running")
        page.locator("#prompt").press("Escape")
        expect_state(block, "cancelling")  # the cancel is sent: the route holds it
        opened.set()  # so the command ends on its own, and its complete goes out first
        expect_state(block, "ok")
        # The console answers frames in order and the page handles them in
        # order: once the next command's block ended, the error came before.
        expect_state(run(page, "jobs"), "ok")
        crossed = [f for f in down if f["type"] == "error"]
        assert [(f["id"], f["ref"]) for f in crossed] == [(None, block.get_attribute("data-id"))]
        expect(page.locator(".notice-error")).to_have_count(0)
        expect(page.locator("#log")).not_to_contain_text("no live command")

        # An error about an id that is not one of this page's is still shown.
        routes[-1].send(json.dumps({"type": "cancel", "id": "zz"}))
        expect(page.locator(".notice-error")).to_have_text("server: no live command with id 'zz'")
