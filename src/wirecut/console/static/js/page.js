// The page's commands: running a line, cancelling, the frames of each id, the
// live strip, the log's notices, and what a dropped connection means for them.
//
// Each command is a CommandBlock (block.js) whose state moves only through
// lifecycle.js's table; this module decides which event a frame or a key is.

import { CommandBlock } from "./block.js";
import {
  CLOSE_FORBIDDEN_ORIGIN, CLOSE_UNAUTHORIZED, Connection, closeWords,
} from "./connection.js";
import { ConfirmDialog } from "./dialog.js";
import { fmtMs, h, plural } from "./dom.js";
import { BADGE_TEXT, CommandEvent, CommandState } from "./lifecycle.js";
import { disconnectedLine } from "./report.js";

const TICK_MS = 100;

export class ConsolePage {
  /**
   * `ui`: the page's elements (main.js); `catalog`: the server's commands and
   * labels; `health`: the strip's HealthStrip; `wsUrl`: /api/console's address;
   * `onTokenRefused()`: forget the kept token; `onConnected()`: a `ready` came;
   * `hasToken`: whether the page has a token to send at all.
   */
  constructor({ ui, catalog, health, wsUrl, onTokenRefused, onConnected, hasToken = true }) {
    this.ui = ui;
    this.hasToken = hasToken;
    this.catalog = catalog;
    this.health = health;
    this.onTokenRefused = onTokenRefused;
    this.onConnected = onConnected;
    this.blocks = new Map(); // id -> CommandBlock (live or finished, while its block exists)
    this.held = false; // a pointer is down in the log: it does not scroll (holdScroll)
    this.followAfter = false;
    this.heldAt = 0;
    this.seq = 0;
    this.tickTimer = null;
    this.lostAt = null;
    this.lostNotice = null;
    this.connection = new Connection(wsUrl, {
      conn: ui.conn, text: ui.connText, detail: ui.connDetail, reconnectNow: ui.reconnectNow,
    }, {
      onReady: (frame, again) => this.onReady(frame, again),
      onFrame: (frame) => this.onFrame(frame),
      onClosed: (code, reason, wasConnected) => this.onClosed(code, reason, wasConnected),
    });
    this.dialog = new ConfirmDialog({
      dialog: ui.dialog, line: ui.dialogLine, message: ui.dialogMessage,
      yes: ui.dialogYes, no: ui.dialogNo,
    }, {
      answer: (id, yes) => this.answer(id, yes),
      stillAsking: (id) => this.blocks.get(id)?.state === CommandState.CONFIRM,
      prompt: ui.prompt,
    });
  }

  start() {
    this.renderJobs();
    this.connection.connect();
  }

  get connected() {
    return this.connection.connected;
  }

  // -- the log ---------------------------------------------------------------------

  nearBottom() {
    const log = this.ui.log;
    return log.scrollHeight - log.scrollTop - log.clientHeight < 48;
  }

  /** Append (or grow) something in the log, following the end only if the reader was there. */
  withScroll(change) {
    const follow = !this.held && this.nearBottom();
    change();
    if (follow) this.ui.log.scrollTop = this.ui.log.scrollHeight;
  }

  /**
   * While a pointer is down in the log the log holds still, so that a press on
   * a streaming block's Cancel button is still on it when released (following
   * the output moved the button away between the two); on release it catches up.
   */
  holdScroll(held) {
    if (held === this.held) return;
    const log = this.ui.log;
    if (held) {
      this.followAfter = this.nearBottom();
      this.heldAt = log.scrollTop;
    }
    this.held = held;
    // After the click that this release may complete has found its target,
    // and not if the reader scrolled meanwhile (a touch pan ends as a release).
    if (!held && this.followAfter) {
      setTimeout(() => {
        if (!this.held && log.scrollTop === this.heldAt) log.scrollTop = log.scrollHeight;
      }, 0);
    }
  }

  notice(text, tone = "info") {
    const node = h("div", `notice notice-${tone}`);
    node.textContent = text;
    this.withScroll(() => this.ui.log.append(node));
    return node;
  }

  announce(text) {
    this.ui.announce.textContent = text;
  }

  // -- commands --------------------------------------------------------------------

  live() {
    return [...this.blocks.values()].filter((b) => b.live);
  }

  /** Send `line` under a new id; false (the line is kept) when not connected. */
  run(line) {
    if (!this.connected) return false;
    this.seq += 1;
    const block = new CommandBlock(`c${this.seq}`, line, {
      onCancel: (b) => {
        this.cancel(b.id);
        this.ui.prompt.focus();
      },
      label: (event) => this.catalog.label(event),
    });
    this.blocks.set(block.id, block);
    this.ui.log.append(block.el.root);
    this.ui.log.scrollTop = this.ui.log.scrollHeight; // a new command is always brought into view
    // The id is the page's own (docs/protocol.md): a cancel can follow at once,
    // before any answer, and the server reads it after the run.
    this.connection.send({ type: "run", id: block.id, line });
    this.renderJobs();
    this.ensureTicking();
    return true;
  }

  cancel(id) {
    const block = this.blocks.get(id);
    if (!block || !block.live || block.state === CommandState.CANCELLING) return;
    if (this.connected) this.connection.send({ type: "cancel", id });
    block.fire(CommandEvent.CANCEL);
    this.dialog.drop(id);
    this.renderJobs();
  }

  /** Esc: the newest live command that is not already being cancelled; false if none. */
  cancelLatest() {
    const live = this.live().filter((b) => b.state !== CommandState.CANCELLING);
    if (live.length === 0) return false;
    this.cancel(live[live.length - 1].id);
    return true;
  }

  /** Shift+Esc: one frame without an id, which cancels every command of this connection. */
  cancelAll() {
    const live = this.live();
    if (live.length === 0) return;
    if (this.connected) this.connection.send({ type: "cancel" });
    for (const block of live) block.fire(CommandEvent.CANCEL);
    this.dialog.dropAll();
    this.renderJobs();
  }

  answer(id, yes) {
    const block = this.blocks.get(id);
    if (!block || block.state !== CommandState.CONFIRM) return;
    if (yes) {
      this.connection.send({ type: "confirm", id });
      block.fire(CommandEvent.CONFIRMED);
      this.withScroll(() => block.append("note", "confirmed\n"));
      this.renderJobs();
    } else {
      this.withScroll(() => block.append("note", "declined\n"));
      this.cancel(id); // declining is a cancel of that command
    }
  }

  /** Ctrl+L: clear the finished blocks, keep the live ones. */
  clearFinished() {
    for (const node of [...this.ui.log.children]) {
      const block = node.dataset.id ? this.blocks.get(node.dataset.id) : null;
      if (block && block.live) continue;
      if (block) this.blocks.delete(block.id);
      node.remove();
    }
  }

  // -- frames from the server ---------------------------------------------------------

  onReady(frame, again) {
    if (frame.prompt) this.ui.ps.textContent = String(frame.prompt).trim();
    if (this.lostNotice) {
      const down = this.lostAt === null ? null : performance.now() - this.lostAt;
      this.lostNotice.append(
        h("span", "notice-ok", ` Reconnected${down === null ? "" : ` after ${fmtMs(down)}`}.`),
      );
      this.lostNotice = null;
      this.lostAt = null;
      this.announce("Reconnected.");
    } else if (!again) {
      const hello = this.notice("", "hello");
      hello.append(
        h("strong", null, `wirecut ${frame.version || ""}`),
        document.createTextNode(" — type "),
        h("code", null, "help"),
        document.createTextNode(" for the commands. Each command runs in its own block; "
          + "Cancel stops it for real and shows how the unwind went."),
      );
      const mcp = this.catalog.mcpWords();
      if (mcp) this.notice(mcp, "mcp");
    }
    this.onConnected();
    this.health.poll();
  }

  onFrame(frame) {
    const block = typeof frame.id === "string" ? this.blocks.get(frame.id) : undefined;
    if (frame.type === "error") {
      this.onError(block, frame);
      return;
    }
    if (!block) return; // "pong", an id cleared by Ctrl+L, and frames a newer server may add
    switch (frame.type) {
      case "accepted":
        block.fire(frame.queued ? CommandEvent.QUEUED : CommandEvent.ACCEPTED);
        break;
      case "started":
        block.fire(CommandEvent.STARTED);
        break;
      case "output":
        this.withScroll(() => block.append(String(frame.stream), String(frame.data ?? "")));
        return;
      case "confirm_required":
        this.onConfirmRequired(block, String(frame.message || ""));
        break;
      case "complete":
        this.finish(block, frame);
        break;
      default:
        return;
    }
    this.renderJobs();
  }

  onConfirmRequired(block, message) {
    if (block.fire(CommandEvent.CONFIRM_REQUIRED) !== CommandState.CONFIRM) return;
    block.confirmMessage = message;
    this.withScroll(() => block.append("confirm", `${message.replace(/\n+$/, "")}\n`));
    this.dialog.ask(block.id, block.line, message);
  }

  onError(block, frame) {
    const message = String(frame.message || "error");
    if (!block) {
      // An error about one of this page's commands that already completed
      // (named in "ref", docs/protocol.md; a server without "ref" kept it in
      // "id") is an Esc or Cancel that crossed the command's complete on the
      // wire: the block says how it ended, and the race is normal, not news.
      // Any other error is shown.
      const about = typeof frame.id === "string" ? frame.id : frame.ref;
      if (!this.ownFinished(about)) this.notice(`server: ${message}`, "error");
      return;
    }
    if (block.state === CommandState.SENDING) {
      // The run itself was refused (e.g. a duplicate id): there will be no complete.
      this.finish(block, { status: "error", error: message, refused: true });
      return;
    }
    if (!block.live) return; // a cancel that crossed its command's complete: nothing to say
    this.withScroll(() => block.addError(message));
  }

  /**
   * True when `id` is one this page gave a command (`c1`, `c2`, …) that is no
   * longer live: finished, or its block cleared by Ctrl+L. Told by its form and
   * the page's count, so no list of past ids is kept.
   */
  ownFinished(id) {
    const own = typeof id === "string" ? /^c([1-9][0-9]*)$/.exec(id) : null;
    if (!own || Number(own[1]) > this.seq) return false;
    const block = this.blocks.get(id);
    return !block || !block.live;
  }

  finish(block, frame) {
    this.dialog.drop(block.id);
    this.withScroll(() => block.finish(frame));
    this.renderJobs();
    this.announce(`${block.id} ${block.line}: ${BADGE_TEXT[block.state]}`);
    this.health.soon();
  }

  // -- a closed connection -------------------------------------------------------------

  onClosed(code, reason, wasConnected) {
    // Closing a connection cancels every command of it on the server (docs/protocol.md);
    // their complete frames had nowhere to go, so the page says it itself.
    const orphans = this.live();
    for (const block of orphans) {
      block.fire(CommandEvent.DISCONNECTED);
      block.el.time.textContent = fmtMs(performance.now() - block.sentAt);
      this.withScroll(() => block.el.root.append(disconnectedLine()));
    }
    this.dialog.dropAll();
    this.renderJobs();

    if (code === CLOSE_UNAUTHORIZED || code === CLOSE_FORBIDDEN_ORIGIN) {
      if (code === CLOSE_UNAUTHORIZED) this.onTokenRefused();
      const open = "Open the address that `wirecut serve` printed (it ends in ?token=…).";
      if (code === CLOSE_UNAUTHORIZED && !this.hasToken) {
        // Nothing was refused: the page had no token to send (opened without ?token=).
        this.connection.stop("no token");
        this.notice(`This page has no token, and the server wants one. ${open}`, "error");
      } else if (code === CLOSE_UNAUTHORIZED) {
        this.connection.stop("token refused");
        this.notice(`The server refused the token. ${open}`, "error");
      } else {
        this.connection.stop("origin refused");
        this.notice("The server refused this page's origin.", "error");
      }
      return;
    }
    if (wasConnected || !this.lostNotice) {
      this.lostAt = wasConnected ? performance.now() : this.lostAt ?? performance.now();
      let text = wasConnected
        ? `Connection lost${closeWords(code, reason)}.`
        : "Cannot reach the server.";
      if (orphans.length) {
        text += ` ${plural(orphans.length, "command", "commands")} of that connection `
          + `${orphans.length === 1 ? "was" : "were"} cancelled by the disconnect `
          + `(${orphans.map((b) => b.id).join(", ")}).`;
      }
      text += " Reconnecting…";
      this.lostNotice = this.notice(text, "warn");
      this.announce(text);
    }
  }

  // -- the live strip --------------------------------------------------------------------

  renderJobs() {
    const live = this.live();
    const jobs = this.ui.jobs;
    const ids = live.map((b) => b.id).join(",");
    if (jobs.dataset.ids !== ids) {
      jobs.dataset.ids = ids;
      jobs.replaceChildren(...live.map((b) => this.jobChip(b)));
    }
    for (const block of live) {
      const chip = jobs.querySelector(`[data-id="${CSS.escape(block.id)}"]`);
      if (!chip) continue;
      chip.dataset.state = block.state;
      chip.querySelector(".job-state").textContent = BADGE_TEXT[block.state];
      chip.querySelector(".job-cancel").hidden = block.state === CommandState.CANCELLING;
    }
    this.ui.jobsEmpty.hidden = live.length > 0;
    document.title = live.length ? `(${live.length}) wirecut console` : "wirecut console";
    this.ui.cancelAll.hidden =
      live.filter((b) => b.state !== CommandState.CANCELLING).length === 0;
    this.updateTimes();
  }

  jobChip(block) {
    const chip = h("li", "job");
    chip.dataset.id = block.id;
    const label = h("span", "job-label");
    label.append(
      h("span", "job-state"), h("code", "job-id", block.id), h("span", "job-line", block.line),
    );
    label.title = block.line;
    const time = h("span", "job-time");
    const cancel = h("button", "job-cancel", "×");
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Cancel ${block.id}: ${block.line}`);
    cancel.title = "Cancel";
    cancel.addEventListener("click", () => {
      this.cancel(block.id);
      this.ui.prompt.focus();
    });
    chip.append(label, time, cancel);
    return chip;
  }

  updateTimes() {
    const now = performance.now();
    for (const block of this.live()) {
      block.tick(now);
      const chip = this.ui.jobs.querySelector(`[data-id="${CSS.escape(block.id)}"] .job-time`);
      if (chip) chip.textContent = block.el.time.textContent;
    }
  }

  ensureTicking() {
    if (this.tickTimer !== null) return;
    this.tickTimer = setInterval(() => {
      this.updateTimes();
      if (this.live().length === 0) {
        clearInterval(this.tickTimer);
        this.tickTimer = null;
      }
    }, TICK_MS);
  }
}
