// The prompt's history: kept in the browser's local storage across reloads and
// shared by the tabs of one origin (each Enter merges with what others added).

import { storageGet, storageSet } from "./dom.js";

const KEY = "wirecut.history";
const MAX = 500;

function load() {
  try {
    const stored = JSON.parse(storageGet(localStorage, KEY) || "[]");
    return Array.isArray(stored) ? stored.filter((x) => typeof x === "string") : [];
  } catch {
    return [];
  }
}

export class History {
  constructor() {
    this.lines = load();
    this.pos = null; // null: at the draft, not in the history
    this.draft = "";
  }

  remember(line) {
    // Another tab may have added lines since this one loaded: merge, newest last.
    const lines = load();
    if (lines[lines.length - 1] !== line) lines.push(line);
    this.lines = lines.slice(-MAX);
    storageSet(localStorage, KEY, JSON.stringify(this.lines));
    this.reset();
  }

  reset() {
    this.pos = null;
    this.draft = "";
  }

  /** Up (-1) or down (+1) from the prompt's `current` text: the text to show, or null. */
  step(delta, current) {
    const list = this.lines;
    if (!list.length) return null;
    if (this.pos === null) {
      if (delta > 0) return null;
      this.draft = current;
      this.pos = list.length;
    }
    const next = this.pos + delta;
    if (next < 0) return null;
    if (next >= list.length) {
      this.pos = null;
      return this.draft;
    }
    this.pos = next;
    return list[next];
  }
}
