// Small helpers every module of the page uses: elements, numbers as people read
// them, and storage that may be switched off.
//
// No module here touches the page's state: they build nodes and strings.

/** The element with this id (the page's own markup; see index.html). */
export const $ = (id) => document.getElementById(id);

/** A new element with a class and a text: text always as textContent, never markup. */
export function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/** 0.41 ms, 12 ms, 3.2 s, 2m 05s. */
export function fmtMs(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "?";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const minutes = Math.floor(ms / 60000);
  const seconds = Math.floor((ms % 60000) / 1000);
  return `${minutes}m ${String(seconds).padStart(2, "0")}s`;
}

export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

export function storageGet(storage, key) {
  try {
    return storage.getItem(key);
  } catch {
    return null; // Storage disabled (private modes, policies): the page still works.
  }
}

export function storageSet(storage, key, value) {
  try {
    if (value === null) storage.removeItem(key);
    else storage.setItem(key, value);
  } catch {
    // Not kept across reloads then; nothing else depends on it.
  }
}
