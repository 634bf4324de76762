// One command and its block in the log: the line, the id, the state badge, the
// elapsed time, the output as it arrives, its error, and at the end its facts.
//
// A block's state moves only through lifecycle.js's table (`fire`). Output is
// shown as it arrives, with two display rules for what a model streams: a run of
// blank lines shows as one blank line (a small base model may pad its reply with
// hundreds of newlines), and a run of spaces or tabs is cut to a few. An error
// message is shown once per block, however many frames carry it.

import { fmtMs, h } from "./dom.js";
import {
  BADGE_TEXT, CommandEvent, CommandState, completeEvent, isLive, transition,
} from "./lifecycle.js";
import { factsLine, lateCancelLine, unwindChart, usageWords } from "./report.js";

// A block that streams for hours keeps only its last this-many characters.
const OUTPUT_MAX_CHARS = 400000;
// The longest run of spaces or tabs a token stream shows.
const MAX_SPACES = 16;

/** Folds what a model streams for display: blank-line runs to one, long space runs cut. */
export class WhitespaceFolder {
  constructor() {
    this.newlines = 2; // at the start: no leading blank lines at all
    this.spaces = "";  // spaces held at a line's start until the line proves not blank
    this.run = 0; // spaces shown in a row
  }

  /** The part of `data` to show (spaces that may start a blank line are held back). */
  feed(data) {
    let out = "";
    for (const ch of data) {
      if (ch === "\r") continue; // a carriage return only moves a terminal's cursor
      if (ch === "\n") {
        this.spaces = ""; // a line of spaces only is a blank line
        this.run = 0;
        if (this.newlines < 2) out += "\n";
        this.newlines += 1;
      } else if (ch === " " || ch === "\t") {
        if (this.newlines > 0) {
          if (this.spaces.length < MAX_SPACES) this.spaces += ch;
        } else if (this.run < MAX_SPACES) {
          out += ch;
          this.run += 1;
        }
      } else {
        out += this.spaces + ch;
        this.spaces = "";
        this.newlines = 0;
        this.run = 0;
      }
    }
    return out;
  }
}

export class CommandBlock {
  /**
   * `onCancel(block)` is what its Cancel button does; `label(event)` names an
   * unwind step.
   */
  constructor(id, line, { onCancel, label }) {
    this.id = id;
    this.line = line;
    this.state = CommandState.SENDING;
    this.sentAt = performance.now();
    this.confirmMessage = null;
    this.label = label;
    this.outChars = 0;
    this.lastStream = null;
    this.lastText = null;
    this.folder = new WhitespaceFolder();
    this.errors = new Set(); // messages shown in an error box
    this.stderrTail = ""; // the end of its stderr output, to not repeat an error it printed
    this.el = this.build(onCancel);
    this.show();
  }

  get live() {
    return isLive(this.state);
  }

  /** Move by `event` (lifecycle.js); throws a LifecycleError for a move the table lacks. */
  fire(event) {
    this.state = transition(this.id, this.state, event);
    this.show();
    return this.state;
  }

  build(onCancel) {
    const root = h("article", "cmd");
    root.dataset.id = this.id;
    root.setAttribute("aria-label", `command ${this.id}: ${this.line}`);

    const head = h("header", "cmd-head");
    const line = h("div", "cmd-line");
    line.append(h("span", "cmd-ps", "›"), h("code", "cmd-text", this.line));
    const meta = h("div", "cmd-meta");
    const id = h("span", "cmd-id", this.id);
    id.title = "the command's id on this connection";
    const badge = h("span", "badge");
    const time = h("span", "cmd-time", "");
    const cancel = h("button", "btn btn-cancel btn-small cmd-cancel", "Cancel");
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Cancel ${this.id}: ${this.line}`);
    cancel.addEventListener("click", () => onCancel(this));
    meta.append(id, badge, time, cancel);
    head.append(line, meta);

    const out = h("pre", "cmd-out");
    out.hidden = true;
    root.append(head, out);
    return { root, badge, time, cancel, out };
  }

  show() {
    const { root, badge, cancel } = this.el;
    root.dataset.state = this.state;
    badge.textContent = BADGE_TEXT[this.state];
    badge.dataset.state = this.state;
    cancel.hidden = !this.live || this.state === CommandState.CANCELLING;
  }

  tick(now) {
    if (this.live) this.el.time.textContent = fmtMs(now - this.sentAt);
  }

  /** Output of `stream` ("stdout", "stderr", "token", or the page's "confirm" and "note"). */
  append(stream, data) {
    if (stream === "token") data = this.folder.feed(data);
    if (stream === "stderr") this.stderrTail = (this.stderrTail + data).slice(-4096);
    if (!data) return;
    const own = stream === "confirm" || stream === "note";
    if (own && this.lastText && !this.lastText.data.endsWith("\n")) data = `\n${data}`; // a line of its own
    const out = this.el.out;
    out.hidden = false;
    if (this.lastStream === stream && this.lastText) {
      this.lastText.appendData(data); // grows one text node: no re-layout of the whole block
    } else {
      const span = h("span", `out-${stream}`);
      this.lastText = document.createTextNode(data);
      span.append(this.lastText);
      out.append(span);
      this.lastStream = stream;
    }
    this.outChars += data.length;
    if (this.outChars > OUTPUT_MAX_CHARS) this.trim();
  }

  trim() {
    const out = this.el.out;
    let excess = this.outChars - OUTPUT_MAX_CHARS;
    for (const span of [...out.querySelectorAll("span[class^='out-']")]) {
      if (excess <= 0) break;
      const length = span.textContent.length;
      if (length <= excess && span.lastChild !== this.lastText) {
        span.remove();
        excess -= length;
        this.outChars -= length;
      } else {
        const text = span.firstChild;
        const cut = Math.min(excess, text.length);
        text.deleteData(0, cut);
        this.outChars -= cut;
        excess -= cut;
      }
    }
    if (!out.querySelector(".out-trimmed")) {
      out.prepend(h("span", "out-trimmed", "… earlier output trimmed\n"));
    }
  }

  /** An error box, once per message (an error frame and the complete may both carry it). */
  addError(message) {
    const text = String(message);
    if (this.errors.has(text)) return;
    this.errors.add(text);
    // The command already printed it as its last stderr line: the red bar shows it.
    if (this.stderrTail.trimEnd().endsWith(text.trim())) return;
    const box = h("div", "cmd-error");
    box.append(h("span", "cmd-error-label", "error"), document.createTextNode(text));
    this.el.root.append(box);
  }

  /** The `complete` frame (or one the page makes for a refused run): its state and facts. */
  finish(frame) {
    const status = frame.status || "error";
    this.fire(frame.refused ? CommandEvent.REFUSED : completeEvent(status));
    const elapsed = typeof frame.elapsed_ms === "number"
      ? frame.elapsed_ms : performance.now() - this.sentAt;
    this.el.time.textContent = fmtMs(elapsed);
    if (frame.error) this.addError(frame.error);
    if (status === "cancelled" || status === "timeout") {
      this.el.root.append(factsLine(frame));
      const chart = unwindChart(frame.lifecycle || {}, this.label);
      if (chart) this.el.root.append(chart);
    } else if (status === "ok") {
      if (frame.late_cancel) this.el.root.append(lateCancelLine(frame));
      const extra = usageWords(frame.usage);
      if (extra) this.el.root.append(h("div", "cmd-foot", extra));
    }
  }
}
