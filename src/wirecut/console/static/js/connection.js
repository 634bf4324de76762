// The page's one WebSocket on /api/console: open, frames in and out, and the
// reconnect with backoff (0.5 s, 1 s, 2 s, … 15 s, with a little jitter so many
// tabs keep apart). The connection indicator in the header is drawn here.
//
// What a close means for the commands (the server cancelled them) is the
// caller's to say: `onClosed(code, reason, wasConnected)` comes first, and the
// caller may `stop()` retrying (a close code that a retry cannot fix).

export const CLOSE_UNAUTHORIZED = 4401;
export const CLOSE_FORBIDDEN_ORIGIN = 4403;

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000]; // the last one repeats

// WebSocket close codes a person may meet, in words (1006: no close frame at all).
const CLOSE_WORDS = {
  1001: "the server went away",
  1011: "server error",
  1012: "the server is restarting",
};

/** " (the server went away: reason)" for a notice; "" when there is nothing to add. */
export function closeWords(code, reason) {
  const known = CLOSE_WORDS[code];
  if (reason) return ` (${known ? `${known}: ` : `code ${code}: `}${reason})`;
  if (known) return ` (${known})`;
  return code && code !== 1006 ? ` (code ${code})` : "";
}

export class Connection {
  /**
   * `url`: the WebSocket's; `ui`: the indicator's elements (conn, text, detail,
   * reconnectNow); `handlers`: {onReady(frame), onFrame(frame), onClosed(code,
   * reason, wasConnected)}.
   */
  constructor(url, ui, handlers) {
    this.url = url;
    this.ui = ui;
    this.handlers = handlers;
    this.ws = null;
    this.connected = false;
    this.everConnected = false;
    this.stopped = false;
    this.attempt = 0;
    this.retryTimer = null;
    this.countdown = null;
    this.retryAt = 0;
    ui.reconnectNow.addEventListener("click", () => {
      this.attempt = 0;
      this.connect();
    });
    // Back online, or back to this tab: no reason to sit out the rest of a long backoff.
    window.addEventListener("online", () => {
      if (this.retryTimer !== null) this.connect();
    });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible" && this.retryTimer !== null) this.connect();
    });
  }

  /** Send one frame (dropped when not connected: the caller checks `connected` first). */
  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
  }

  indicate(kind, text, detail = "") {
    this.ui.conn.dataset.state = kind;
    this.ui.text.textContent = text;
    this.ui.detail.textContent = detail ? ` · ${detail}` : "";
    this.ui.reconnectNow.hidden = kind !== "waiting";
  }

  connect() {
    this.stopRetry();
    if (this.stopped) return;
    this.indicate("connecting", this.everConnected ? "reconnecting…" : "connecting…");
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (error) {
      this.closed(null, 1006, String(error));
      return;
    }
    this.ws = ws;
    ws.addEventListener("message", (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return; // not the protocol; nothing sensible to show
      }
      if (!frame || typeof frame !== "object") return;
      if (frame.type === "ready") {
        this.connected = true;
        this.attempt = 0;
        this.indicate("connected", "connected", frame.version ? `wirecut ${frame.version}` : "");
        this.handlers.onReady(frame, this.everConnected);
        this.everConnected = true;
        return;
      }
      this.handlers.onFrame(frame);
    });
    ws.addEventListener("close", (event) => this.closed(ws, event.code, event.reason));
  }

  closed(ws, code, reason) {
    if (ws !== null && ws !== this.ws) return;
    const wasConnected = this.connected;
    this.ws = null;
    this.connected = false;
    this.handlers.onClosed(code, reason, wasConnected);
    if (!this.stopped) this.scheduleReconnect();
  }

  /** No more retries (a refused token or origin); the indicator says `text`. */
  stop(text) {
    this.stopped = true;
    this.stopRetry();
    this.indicate("stopped", text);
  }

  scheduleReconnect() {
    const base = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt += 1;
    this.retryAt = performance.now() + delay;
    const show = () => {
      const left = Math.max(0, this.retryAt - performance.now());
      this.indicate("waiting", `disconnected · retrying in ${Math.ceil(left / 1000)} s`);
    };
    show();
    this.stopRetry();
    this.countdown = setInterval(show, 250);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  stopRetry() {
    clearTimeout(this.retryTimer);
    clearInterval(this.countdown);
    this.retryTimer = null;
    this.countdown = null;
  }
}
