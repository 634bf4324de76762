// The wirecut console page: wiring. It finds the page's elements, takes the
// token, loads the server's catalog (GET /api/commands), then connects to
// /api/console and polls /api/health, and binds the keys.
//
// Everything goes through the public protocol (docs/protocol.md), so any other
// client could do the same. ES modules and no build step: the server ships these
// files as they are, under a CSP that allows scripts from its own origin only.
// The page's behaviour is described in docs/web-console.md.
//
//   main.js        wiring, the token, keys and the prompt
//   page.js        the commands: run, cancel, frames, the live strip, notices
//   block.js       one command's block: output, errors, its facts at the end
//   lifecycle.js   a block's states and events: the transition table
//   report.js      the facts line and the unwind chart of a complete
//   connection.js  the WebSocket and its reconnect
//   dialog.js      the confirmation dialog
//   catalog.js     the server's commands (Tab) and timeline labels
//   health.js      the /api/health strip
//   history.js     the prompt's history
//   dom.js         small helpers

import { Catalog } from "./catalog.js";
import { $, storageGet, storageSet } from "./dom.js";
import { HealthStrip } from "./health.js";
import { History } from "./history.js";
import { ConsolePage } from "./page.js";

const TOKEN_KEY = "wirecut.token"; // sessionStorage: the token, never in the address bar

// -- the token: from ?token= once, then session storage ------------------------------

function takeToken() {
  const url = new URL(location.href);
  const given = url.searchParams.get("token");
  if (given !== null) {
    storageSet(sessionStorage, TOKEN_KEY, given);
    url.searchParams.delete("token");
    // Out of the address bar (and so out of bookmarks, history and screen shares).
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
    return given;
  }
  return storageGet(sessionStorage, TOKEN_KEY);
}

const token = takeToken();
const basePath = location.pathname.replace(/[^/]*$/, "");
const authHeaders = token ? { Authorization: `Bearer ${token}` } : {};

function consoleUrl() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = token ? `?token=${encodeURIComponent(token)}` : "";
  return `${scheme}://${location.host}${basePath}api/console${query}`;
}

// -- the page ------------------------------------------------------------------------

const ui = {
  log: $("log"),
  prompt: $("prompt"),
  form: $("prompt-form"),
  ps: $("ps"),
  hint: $("hint-text"),
  conn: $("conn"),
  connText: $("conn-text"),
  connDetail: $("conn-detail"),
  reconnectNow: $("reconnect-now"),
  health: $("health"),
  healthItems: $("health-items"),
  jobs: $("jobs"),
  jobsEmpty: $("jobs-empty"),
  cancelAll: $("cancel-all"),
  dialog: $("confirm"),
  dialogLine: $("confirm-line"),
  dialogMessage: $("confirm-message"),
  dialogYes: $("confirm-yes"),
  dialogNo: $("confirm-no"),
  announce: $("announce"),
};
// Our own static markup (kbd elements), read once at load and put back as nodes.
const defaultHint = [...ui.hint.childNodes].map((node) => node.cloneNode(true));

function hint(text, tone) {
  if (text === null) {
    ui.hint.replaceChildren(...defaultHint.map((node) => node.cloneNode(true)));
    ui.hint.dataset.tone = "";
    return;
  }
  ui.hint.textContent = text;
  ui.hint.dataset.tone = tone || "";
}

const catalog = new Catalog();
const health = new HealthStrip(`${basePath}api/health`, authHeaders, ui.health, ui.healthItems);
const lines = new History();
const page = new ConsolePage({
  ui,
  catalog,
  health,
  wsUrl: consoleUrl(),
  onTokenRefused: () => storageSet(sessionStorage, TOKEN_KEY, null),
  onConnected: () => hint(null),
  hasToken: Boolean(token),
});

function setPrompt(value) {
  ui.prompt.value = value;
  const end = value.length;
  ui.prompt.setSelectionRange(end, end);
}

// -- keys and the prompt ---------------------------------------------------------------

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const line = ui.prompt.value.trim();
  if (!line) return;
  if (!page.run(line)) {
    hint("Not connected: the line is kept; press Enter again once the page has reconnected.",
      "warn");
    return;
  }
  lines.remember(line);
  ui.prompt.value = "";
  hint(null);
});

ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "ArrowUp" && !event.altKey && !event.shiftKey) {
    event.preventDefault();
    const text = lines.step(-1, ui.prompt.value);
    if (text !== null) setPrompt(text);
  } else if (event.key === "ArrowDown" && !event.altKey && !event.shiftKey) {
    event.preventDefault();
    const text = lines.step(1, ui.prompt.value);
    if (text !== null) setPrompt(text);
  } else if (event.key === "Tab" && !event.shiftKey && !event.ctrlKey && !event.altKey) {
    const atEnd = ui.prompt.selectionStart === ui.prompt.value.length;
    const result = ui.prompt.value && atEnd ? catalog.complete(ui.prompt.value) : null;
    // Nothing to complete: Tab moves the focus on, as everywhere else on the page.
    if (!result) return;
    event.preventDefault();
    setPrompt(result.completed);
    if (result.choices.length > 1) hint(result.choices.join("   "), "choices");
    else hint(null);
  } else if (event.key === "l" && event.ctrlKey && !event.altKey && !event.metaKey) {
    event.preventDefault();
    page.clearFinished();
  }
});

ui.prompt.addEventListener("input", () => {
  lines.pos = null;
  if (ui.hint.dataset.tone) hint(null);
});

document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape" || page.dialog.open) return;
  if (event.shiftKey) {
    event.preventDefault();
    page.cancelAll();
    return;
  }
  if (page.cancelLatest()) {
    event.preventDefault();
  } else if (document.activeElement === ui.prompt && ui.prompt.value) {
    event.preventDefault();
    setPrompt("");
    lines.pos = null;
  }
});

// Typing anywhere (outside a button or the dialog) goes to the prompt.
document.addEventListener("keydown", (event) => {
  if (page.dialog.open || event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.key.length !== 1 || document.activeElement === ui.prompt) return;
  if (document.activeElement instanceof HTMLButtonElement && event.key === " ") return;
  ui.prompt.focus();
});

ui.log.addEventListener("pointerdown", () => page.holdScroll(true));
for (const type of ["pointerup", "pointercancel"]) {
  document.addEventListener(type, () => page.holdScroll(false));
}

ui.cancelAll.addEventListener("click", () => {
  page.cancelAll();
  ui.prompt.focus();
});
ui.reconnectNow.addEventListener("click", () => ui.prompt.focus());

// -- start -----------------------------------------------------------------------------

ui.prompt.focus();
health.poll();
// The catalog first (one request on loopback), so Tab and the chart's labels are
// ready by the time the page says "connected".
await catalog.load(`${basePath}api/commands`, authHeaders);
page.start();
