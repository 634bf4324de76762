"""The browser the page's tests and the screenshot script drive, and typing a line into it.

Debian's Chromium (``apt-get install chromium``) under Playwright: its own
browser download cannot reach its CDN here. Nothing it loads leaves loopback.
"""

from __future__ import annotations

from playwright.sync_api import Locator, Page, expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def run(page: Page, line: str, wait_ms: float = 15_000) -> Locator:
    """Type ``line`` at the prompt, press Enter; the new command's block (a Locator)."""
    before = page.locator("article.cmd").count()
    prompt = page.locator("#prompt")
    prompt.fill(line)
    prompt.press("Enter")
    block = page.locator("article.cmd").nth(before)
    expect(block.locator(".cmd-text")).to_have_text(line, timeout=wait_ms)
    return block
