"""Take docs/screenshot-local.png: the web console on the embedded default model.

Run: ``python scripts/screenshot_local.py [--out docs/screenshot-local.png]``.
Starts ``wirecut serve`` as the README's first command does (the embedded
llama.cpp with SmolLM2-135M-Instruct from the per-user cache; ``wirecut
local --fetch-model`` puts it there), seeds a small note store, and drives
the page in Debian's Chromium (Playwright, ``/usr/bin/chromium``): a chat
answered in a sentence, a long chat cancelled mid-stream (its facts), and
``curator run --consolidate`` up to its confirmation dialog. A small model
does not always plan: the consolidation is asked up to ``--tries`` times
until the dialog shows a plan. Nothing is confirmed; traffic stays on
loopback. The README's other screenshot (the simulator) is taken by
``tests/test_web.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Locator, Page, expect, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _page import CHROMIUM, CHROMIUM_ARGS, run
from wirecut.memory import NoteStore

ROOT = Path(__file__).resolve().parent.parent
WAIT_MS = 120_000
NOTES = [
    ("Lyon trip", "Train to Lyon at 9:12 on Friday"),
    ("Lyon hotel", "Hotel Bellecour, two nights"),
    ("Bread recipe", "Flour, water, salt"),
    ("Sourdough starter", "Feed the bread starter daily"),
    ("Guitar chords", "G, C, D, E minor"),
]


def ended(block: Locator) -> str:
    expect(block).not_to_have_attribute("data-state", "running", timeout=WAIT_MS)
    return block.get_attribute("data-state") or ""


def streaming(page: Page, block: Locator, chars: int) -> str:
    """ "running" once ``block`` shows ``chars`` characters of reply while running; else "ended"."""
    handle = page.wait_for_function(
        """([id, chars]) => {
            const b = document.querySelector(`article.cmd[data-id="${id}"]`);
            if (!b) return null;
            const text = [...b.querySelectorAll(".out-token")].map((s) => s.textContent).join("");
            if (b.dataset.state !== "running") return "ended";
            return text.length >= chars ? "running" : null;
        }""",
        arg=[block.get_attribute("data-id"), chars],
        timeout=WAIT_MS,
    )
    return str(handle.json_value())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot-local.png")
    parser.add_argument("--tries", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        store = NoteStore.in_data_dir(Path(data))
        for title, body in NOTES:
            store.add(title, body)
        serve = subprocess.Popen(
            [sys.executable, "-m", "wirecut", "serve", "--port", "0", "--data-dir", data],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={
                k: v
                for k, v in os.environ.items()
                if k not in ("WIRECUT_PROVIDER_URL", "OPENAI_BASE_URL")
            },
        )
        try:
            assert serve.stdout is not None
            url = serve.stdout.readline().split(": ", 1)[-1].strip()
            if not url.startswith("http"):
                sys.exit(f"wirecut serve did not start: {url!r}")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                viewport = {"width": 1200, "height": 860}
                page = browser.new_page(viewport=viewport, color_scheme="dark")
                page.goto(url)
                expect(page.locator("#conn")).to_have_attribute(
                    "data-state", "connected", timeout=WAIT_MS
                )
                ended(run(page, "chat Write one sentence about cats.", WAIT_MS))
                for _ in range(args.tries):
                    story = run(
                        page, "chat --new Tell me a long story about a lighthouse keeper.", WAIT_MS
                    )
                    if streaming(page, story, chars=300) == "running":
                        story.locator(".cmd-cancel").click()
                        if ended(story) == "cancelled":
                            break
                else:
                    sys.exit(f"no story to cancel in {args.tries} tries")
                dialog = page.locator("#confirm")
                for _ in range(args.tries):
                    block = run(page, "curator run --consolidate", WAIT_MS)
                    shown = page.wait_for_function(
                        """(id) => {
                            const d = document.getElementById("confirm");
                            const b = document.querySelector(`article.cmd[data-id="${id}"]`);
                            if (d && d.open) return "dialog";
                            return b && b.dataset.state !== "running" ? "ended" : null;
                        }""",
                        arg=block.get_attribute("data-id"),
                        timeout=WAIT_MS,
                    ).json_value()
                    if shown == "dialog":
                        break
                else:
                    sys.exit(f"no plan to confirm in {args.tries} tries")
                expect(dialog).to_be_visible()
                page.screenshot(path=str(args.out))
                dialog.locator("#confirm-no").click()
                ended(block)
                browser.close()
        finally:
            serve.terminate()
            serve.wait(30)
    print(args.out)


if __name__ == "__main__":
    main()
