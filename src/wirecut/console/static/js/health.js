// The server's health in the status strip: GET /api/health every 2 s (and soon
// after a command ends), drawn as busy/queued/leaked workers and open requests
// and processes.

import { h } from "./dom.js";

const EVERY_MS = 2000;
const SOON_MS = 150;

export class HealthStrip {
  /**
   * `url` and `headers` for /api/health (no Authorization header: the page has
   * no token); `root` and `items` are the strip's elements.
   */
  constructor(url, headers, root, items) {
    this.url = url;
    this.headers = headers;
    this.hasToken = "Authorization" in headers;
    this.root = root;
    this.items = items;
    this.timer = null;
    this.soonTimer = null;
    this.busy = false;
  }

  async poll() {
    if (this.busy) return; // the answer on its way is fresh enough
    this.busy = true;
    // A server that accepts and never answers must not stop the polling.
    const abort = new AbortController();
    const giveUp = setTimeout(() => abort.abort(), EVERY_MS * 2);
    try {
      const response = await fetch(this.url, {
        headers: this.headers, cache: "no-store", signal: abort.signal,
      });
      if (response.status === 401) this.render(null, this.hasToken ? "token refused" : "no token");
      else if (!response.ok) this.render(null, `HTTP ${response.status}`);
      else this.render(await response.json(), null);
    } catch {
      this.render(null, "unreachable");
    } finally {
      clearTimeout(giveUp);
      this.busy = false;
    }
    // One chain of polls, however many times this was called.
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.poll(), EVERY_MS);
  }

  /** After a command ends: the server's counts now rather than up to 2 s later. */
  soon() {
    if (this.soonTimer !== null) return;
    this.soonTimer = setTimeout(() => {
      this.soonTimer = null;
      this.poll();
    }, SOON_MS);
  }

  render(health, problem) {
    if (problem !== null) {
      this.root.dataset.state = "down";
      this.items.replaceChildren(h("span", "hitem hitem-warn", problem));
      return;
    }
    const workers = health.workers || {};
    const openRequests = (health.requests || {}).open;
    const openProcesses = (health.processes || {}).open;
    const items = [
      ["busy", `${workers.busy ?? "?"}/${workers.max ?? "?"}`, "busy", "busy",
        workers.busy > 0 ? "active" : null],
      ["queued", workers.queued ?? "?", "queued", "queued", workers.queued > 0 ? "active" : null],
      ["leaked", workers.leaked ?? "?", "leaked", "leaked", workers.leaked > 0 ? "warn" : null],
      ["requests", openRequests ?? "?", openRequests === 1 ? "request open" : "requests open",
        "req", openRequests > 0 ? "active" : null],
      ["processes", openProcesses ?? "?", openProcesses === 1 ? "process" : "processes",
        "proc", openProcesses > 0 ? "active" : null],
    ];
    this.root.dataset.state = workers.leaked > 0 ? "warn" : health.status === "ok" ? "ok" : "warn";
    this.items.replaceChildren(...items.map(([key, value, label, short, tone]) => {
      const item = h("span", tone ? `hitem hitem-${tone}` : "hitem");
      item.dataset.key = key;
      item.title = `${value} ${label}`;
      // The short label is for phone widths (the stylesheet picks one).
      item.append(h("b", null, value), h("span", "hl-long", ` ${label}`),
        h("span", "hl-short", ` ${short}`));
      return item;
    }));
  }
}
